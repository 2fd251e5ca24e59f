"""Moved: the learning-rate schedules are `lingpipe.lr_schedules` now.

This path still imports, for one release, and warns; it is the same module object.
"""

import sys
import warnings

from lingpipe import lr_schedules

warnings.warn(
    "lingpipe.schedules moved to lingpipe.lr_schedules; import it from there (the old "
    "path goes away in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = lr_schedules

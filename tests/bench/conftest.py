"""The smoke tests of bench/ import its scripts as `bench.<script>`, from the repository
root, whichever directory pytest was started in."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

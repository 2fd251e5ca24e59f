"""Schedule cases the pipeline tests share: every training schedule with each K, M and
v that can run (ALL), and the schedule command in a subprocess (Command)."""

import subprocess
import sys

from lingpipe.pipeline.schedules import generators


def _Runs(name, k, m, v):
    """Whether `name` takes these counts (DualPipeV needs M >= 2K)."""
    return name != "dualpipev" or m >= 2 * k


# Every training schedule, K, M and v that can run (test_executor runs them too).
ALL = [
    (name, k, m, v)
    for name in generators.SCHEDULES
    if name != "forward_only"
    for k in (1, 2, 3, 4)
    for m in (1, 2, 4, 8)
    for v in ((1, 2) if name in generators.VIRTUAL else (1,))
    if _Runs(name, k, m, v)
]


def Command(*flags):
    """`python -m lingpipe.pipeline.schedules` with these flags, run in a new process."""
    return subprocess.run(
        [sys.executable, "-m", "lingpipe.pipeline.schedules", *flags],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip

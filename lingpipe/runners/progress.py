"""Progress: a one-line training progress display for a terminal.

    progress = Progress(total_steps=400)
    progress.Start(step)            # the first step this process runs (a checkpoint's)
    for ...:
      progress.Update(step, loss, examples_per_step=batch_size)
    progress.Close()

Every `interval_s` it rewrites one line in place:

    step 120/400  loss 2.3141  4.1 steps/s  131 ex/s  ETA 1m08s

When the stream is not a terminal it writes nothing (the trainer logs instead);
`Update` still returns the line when one is due, and `RateText(step)` gives its
rate and ETA (averaged since the first step) for the trainer's log lines.

The first step after Start traces and compiles the step function, which can take
longer than hundreds of steps: rates and ETAs count only the steps after it, so the
first line has none.
"""

from __future__ import annotations

import math
import operator
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = [
    "FormatDuration",
    "Progress",
    "ProgressLine",
]

_CLEAR_TO_END = "\x1b[K"


def FormatDuration(seconds: float) -> str:
    """Compact duration, rounded: '45s', '1m08s', '2h03m'."""
    seconds = float(seconds)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"FormatDuration: expected a finite number of seconds >= 0, received seconds={seconds}"
        )
    whole = int(seconds + 0.5)  # half up: round() would make 198.5 s '3m18s'
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    minutes = int(seconds / 60 + 0.5)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def _CheckTotal(total_steps: Any, where: str) -> int:
    try:
        total = operator.index(total_steps)
    except TypeError:
        total = None
    if total is None or isinstance(total_steps, bool) or total <= 0:
        raise ValueError(
            f"{where}: expected total_steps to be a positive integer, received "
            f"total_steps={total_steps!r}"
        )
    return total


def _FormatRate(steps_per_sec: float) -> str:
    # Big pipelined models take seconds per step; "0.0 steps/s" would say nothing.
    if steps_per_sec < 1.0:
        return f"{1.0 / steps_per_sec:.1f} s/step"
    return f"{steps_per_sec:.1f} steps/s"


def ProgressLine(
    step: int,
    total: int,
    loss: float | None,
    steps_per_sec: float | None,
    examples_per_sec: float | None,
) -> str:
    """'step 120/400  loss 2.3141  4.1 steps/s  131 ex/s  ETA 1m08s'.

    A field that is None is left out; without a positive rate there is no rate and
    no ETA. A loss of nan or inf prints as 'nan' or 'inf'.
    """
    total = _CheckTotal(total, "ProgressLine")
    fields = [f"step {step}/{total}"]
    if loss is not None:
        fields.append(f"loss {float(loss):.4f}")
    rate = _RateFields(step, total, steps_per_sec, examples_per_sec)
    return "  ".join(fields + ([rate] if rate else []))


def _RateFields(
    step: int, total: int, steps_per_sec: float | None, examples_per_sec: float | None
) -> str:
    """'4.1 steps/s  131 ex/s  ETA 1m08s', or '' without a positive rate."""
    if steps_per_sec is None or not (steps_per_sec > 0 and math.isfinite(steps_per_sec)):
        return ""
    fields = [_FormatRate(steps_per_sec)]
    if examples_per_sec is not None:
        digits = 0 if examples_per_sec >= 10 else 1
        fields.append(f"{examples_per_sec:.{digits}f} ex/s")
    fields.append(f"ETA {FormatDuration(max(total - step, 0) / steps_per_sec)}")
    return "  ".join(fields)


class Progress:
    """Rewrites one progress line on a terminal every `interval_s` (see the module doc).

    Args:
      total_steps: the step training stops at (> 0).
      stream: where the line goes; None is sys.stderr.
      interval_s: least seconds between two lines; the first Update after Start
        always makes one.
      clock: seconds, monotonic; tests pass a fake one.
      is_tty: whether to draw; None asks `stream.isatty()`.
    """

    def __init__(
        self,
        total_steps: int,
        stream: TextIO | None = None,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        is_tty: bool | None = None,
    ) -> None:
        self._total = _CheckTotal(total_steps, "Progress")
        if not interval_s >= 0:
            raise ValueError(
                f"Progress: expected interval_s >= 0, received interval_s={interval_s!r}"
            )
        self._stream = sys.stderr if stream is None else stream
        self._interval_s = float(interval_s)
        self._clock = clock
        if is_tty is None:
            isatty = getattr(self._stream, "isatty", None)
            is_tty = bool(isatty and isatty())
        self._is_tty = is_tty
        self._last_step: int | None = None
        self._last_time = 0.0
        self._line_due = True  # the next Update draws, whatever the interval
        self._line_open = False  # a line was drawn and not ended with a newline
        self._warming_up = True  # the next Update ends the first (tracing) step
        self._origin: tuple[int, float] | None = None  # (step, time) rates count from

    @property
    def total_steps(self) -> int:
        return self._total

    def Start(self, step: int = 0) -> None:
        """Starts timing at `step`: the rate counts only the steps run after it."""
        self._last_step = int(step)
        self._last_time = self._clock()
        self._line_due = True
        self._warming_up = True
        self._origin = None

    def Update(
        self, step: int, loss: float | None, examples_per_step: int | None = None
    ) -> str | None:
        """Call after each step. Returns the progress line when one was due, else None.

        The line is drawn only on a terminal. The first Update after Start (or the
        first without one) ends the tracing step: its line has no rate, and rates
        count from it.
        """
        now = self._clock()
        if self._warming_up:
            self._warming_up = False
            self._origin = (int(step), now)
            rate = None
        else:
            elapsed = now - self._last_time
            if not self._line_due and elapsed < self._interval_s:
                return None
            steps = int(step) - self._last_step
            rate = steps / elapsed if steps > 0 and elapsed > 0 else None
        ex_rate = None if rate is None or examples_per_step is None else rate * examples_per_step
        line = ProgressLine(int(step), self._total, loss, rate, ex_rate)
        self._last_step, self._last_time = int(step), now
        self._line_due = False
        if self._is_tty:
            self._stream.write(f"\r{line}{_CLEAR_TO_END}")
            self._stream.flush()
            self._line_open = True
        return line

    def RateText(self, step: int, examples_per_step: int | None = None) -> str:
        """'4.1 steps/s  131 ex/s  ETA 1m08s' averaged from the end of the first step to
        `step` (now); '' until there is such a rate."""
        if self._origin is None or int(step) <= self._origin[0]:
            return ""
        elapsed = self._clock() - self._origin[1]
        rate = (int(step) - self._origin[0]) / elapsed if elapsed > 0 else None
        ex_rate = None if rate is None or examples_per_step is None else rate * examples_per_step
        return _RateFields(int(step), self._total, rate, ex_rate)

    def Close(self) -> None:
        """Ends the drawn line with a newline (once); a later Update starts a new line."""
        if self._line_open:
            self._stream.write("\n")
            self._stream.flush()
            self._line_open = False

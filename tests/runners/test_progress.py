"""Progress: the line's text, when it is drawn, in-place rewriting, resumed runs, errors."""

import io

import pytest

from lingpipe.runners.progress import FormatDuration, Progress, ProgressLine


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


class TtyStream(io.StringIO):
    def isatty(self):
        return True


def MakeProgress(total=400, is_tty=True, **kw):
    stream, clock = io.StringIO(), FakeClock()
    return Progress(total, stream=stream, clock=clock, is_tty=is_tty, **kw), stream, clock


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (0.4, "0s"),
        (45, "45s"),
        (59.4, "59s"),
        (59.6, "1m00s"),
        (68.29, "1m08s"),
        (198.5, "3m19s"),  # half up, not to even
        (3599.4, "59m59s"),
        (3599.6, "1h00m"),
        (2 * 3600 + 3 * 60 + 10, "2h03m"),
        (125 * 3600, "125h00m"),
    ],
)
def test_format_duration(seconds, text):
    assert FormatDuration(seconds) == text


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_format_duration_rejects(seconds):
    with pytest.raises(
        ValueError, match=rf"finite number of seconds >= 0, received seconds={seconds}"
    ):
        FormatDuration(seconds)


def test_progress_line():
    # ETA: (400 - 120) / 4.1 = 68.3 s.
    line = ProgressLine(120, 400, 2.31414, 4.1, 131.2)
    assert line == "step 120/400  loss 2.3141  4.1 steps/s  131 ex/s  ETA 1m08s"


@pytest.mark.parametrize(
    "args, line",
    [
        ((7, 10, float("nan"), 2.0, None), "step 7/10  loss nan  2.0 steps/s  ETA 2s"),
        ((7, 10, float("inf"), 2.0, 8.0), "step 7/10  loss inf  2.0 steps/s  8.0 ex/s  ETA 2s"),
        ((7, 10, float("-inf"), None, 8.0), "step 7/10  loss -inf"),
        ((7, 10, None, 0.0, 8.0), "step 7/10"),
        # Slower than a step a second: seconds per step, not "0.0 steps/s".
        ((7, 10, 1.5, 0.25, None), "step 7/10  loss 1.5000  4.0 s/step  ETA 12s"),
        # Past the end (eval steps after training): no negative ETA.
        ((12, 10, 1.5, 2.0, None), "step 12/10  loss 1.5000  2.0 steps/s  ETA 0s"),
    ],
)
def test_progress_line_fields(args, line):
    assert ProgressLine(*args) == line


@pytest.mark.parametrize("total", [0, -3, None, 2.5, True, "400"])
def test_total_must_be_positive(total):
    message = rf"expected total_steps to be a positive integer, received total_steps={total!r}"
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Progress(total)
    with pytest.raises(ValueError, match=message):
        ProgressLine(1, total, 1.0, 1.0, None)


def test_interval_must_be_non_negative():
    with pytest.raises(ValueError, match=r"expected interval_s >= 0, received interval_s=-1"):
        Progress(10, interval_s=-1)


def test_draws_first_update_then_every_interval_and_the_tracing_step_has_no_eta():
    progress, stream, clock = MakeProgress(interval_s=5.0)
    progress.Start(0)
    clock.now += 2.0
    first = progress.Update(1, 5.5, examples_per_step=32)
    # The first step traces the graph: 2 s that say nothing of the rate to come.
    assert first == "step 1/400  loss 5.5000"
    assert stream.getvalue() == f"\r{first}\x1b[K"
    for step in range(2, 11):
        clock.now += 0.5
        assert progress.Update(step, 4.0, examples_per_step=32) is None
    assert stream.getvalue() == f"\r{first}\x1b[K"
    clock.now += 0.5  # 5 s after the first line, 10 steps later: 2 steps/s
    second = progress.Update(11, 3.25, examples_per_step=32)
    assert second == "step 11/400  loss 3.2500  2.0 steps/s  64 ex/s  ETA 3m15s"
    assert stream.getvalue() == f"\r{first}\x1b[K\r{second}\x1b[K"
    progress.Close()
    progress.Close()
    assert stream.getvalue() == f"\r{first}\x1b[K\r{second}\x1b[K\n"


def test_not_a_terminal_writes_nothing():
    progress, stream, clock = MakeProgress(is_tty=False, interval_s=1.0)
    progress.Start(0)
    lines = []
    for step in range(1, 6):
        clock.now += 0.5
        lines.append(progress.Update(step, 1.0))
    progress.Close()
    assert stream.getvalue() == ""
    # The lines are still returned when due, for the trainer's log.
    assert lines == [
        "step 1/400  loss 1.0000",
        None,
        "step 3/400  loss 1.0000  2.0 steps/s  ETA 3m19s",
        None,
        "step 5/400  loss 1.0000  2.0 steps/s  ETA 3m18s",
    ]


def test_is_tty_defaults_to_the_stream():
    clock = FakeClock()
    for stream, drawn in [(io.StringIO(), False), (TtyStream(), True)]:
        progress = Progress(10, stream=stream, clock=clock)
        progress.Start(0)
        clock.now += 1.0
        progress.Update(1, 2.0)
        assert bool(stream.getvalue()) == drawn


def test_resumed_run_counts_only_its_own_steps():
    progress, stream, clock = MakeProgress(total=400, interval_s=0.0)
    progress.Start(300)  # the checkpoint's step
    clock.now += 30.0
    progress.Update(301, 2.0)  # traces
    clock.now += 4.0
    line = progress.Update(303, 2.0)
    # 2 steps in 4 s, not 303: 0.5 steps/s, ETA 97 / 0.5 = 194 s.
    assert line == "step 303/400  loss 2.0000  2.0 s/step  ETA 3m14s"


def test_rate_text_for_log_lines_averages_from_the_end_of_the_tracing_step():
    # Log lines written to a file (no terminal) carry the rate and ETA too.
    progress, stream, clock = MakeProgress(total=100, is_tty=False)
    progress.Start(0)
    assert progress.RateText(0) == ""
    clock.now += 60.0
    progress.Update(1, 3.0)  # 60 s of tracing, left out of the rate
    assert progress.RateText(1, examples_per_step=32) == ""
    for step in range(2, 11):
        clock.now += 0.25
        progress.Update(step, 3.0)
    # 9 steps in 2.25 s: 4 steps/s; ETA 90 / 4 = 22.5 s.
    assert progress.RateText(10, examples_per_step=32) == "4.0 steps/s  128 ex/s  ETA 23s"
    assert stream.getvalue() == ""


def test_update_without_start_starts_at_its_step():
    progress, stream, clock = MakeProgress(interval_s=5.0)
    assert progress.Update(50, 2.0) == "step 50/400  loss 2.0000"
    clock.now += 5.0
    assert progress.Update(60, 1.0) == "step 60/400  loss 1.0000  2.0 steps/s  ETA 2m50s"


def test_close_without_a_line_writes_nothing():
    progress, stream, _ = MakeProgress()
    progress.Start(0)
    progress.Close()
    assert stream.getvalue() == ""

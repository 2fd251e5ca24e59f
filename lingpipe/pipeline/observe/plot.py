"""Gantt charts of a pipeline: the plan (a schedule's simulation) and a measured timeline.

One row per device, one bar per action, coloured by kind (KINDS) and labelled with its
micro-batch (Schedule.Label). Drawn with matplotlib's Agg canvas (no display needed) and
written through tf.io.gfile, so the path may be local, gs:// or ram://.

    plot.PlotSimulation(sched, simulate.Simulate(sched), "/tmp/plan.png")
    plot.PlotSpans(timeline.Spans(...), sched, "/tmp/timeline.png")
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe.pipeline.schedules.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
)

__all__ = [
    "KINDS",
    "PlotSimulation",
    "PlotSpans",
]

# Per kind of action: its bars' colour and its name in the legend.
KINDS = {
    FORWARD: ("#4c78a8", "forward"),  # blue
    BACKWARD: ("#f58518", "backward"),  # orange
    BACKWARD_INPUT: ("#e45756", "input grad"),  # red
    BACKWARD_WEIGHT: ("#54a24b", "weight grad"),  # green
}

# A bar: (device, start, end, action), times in the chart's unit.
_Bar = tuple[int, float, float, Action]
_BAR_STYLE = {"height": 0.8, "edgecolor": "white", "linewidth": 0.5}
_TEXT_STYLE = {"ha": "center", "va": "center", "fontsize": 7, "color": "white"}


def _Figure(sched: Schedule, bars: Sequence[_Bar], unit: str, title: str) -> Any:
    """The Gantt chart of `bars`: device 0 on top."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    span = max((end for _, _, end, _ in bars), default=1.0) or 1.0
    width = max(6.0, min(24.0, 0.45 * len(bars) / sched.num_devices + 3))
    fig = Figure(figsize=(width, 1 + 0.6 * sched.num_devices))
    ax = fig.add_subplot(1, 1, 1)
    labels = []  # (text, device, start, end): kept below only where the text fits its bar
    for device, start, end, a in bars:
        ax.barh(device, end - start, left=start, color=KINDS[a.kind][0], **_BAR_STYLE)
        text = ax.text((start + end) / 2, device, sched.Label(a), **_TEXT_STYLE)
        labels.append((text, device, start, end))
    ax.set_yticks(range(sched.num_devices), [f"device {d}" for d in range(sched.num_devices)])
    ax.set_ylim(sched.num_devices - 0.5, -0.5)
    ax.set_xlim(min((start for _, start, _, _ in bars), default=0.0), span)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=9)
    drawn = {a.kind for *_, a in bars}
    handles = [Patch(color=colour, label=name) for k, (colour, name) in KINDS.items() if k in drawn]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1, 1), fontsize=7, frameon=False)
    fig.tight_layout()
    _DropLabelsThatDoNotFit(fig, ax, labels)
    return fig


def _DropLabelsThatDoNotFit(fig: Any, ax: Any, labels: list) -> None:
    """Removes each bar's label that is wider than its bar, or that a bar drawn later on
    the same device covers (measured spans overlap): on short spans neighbouring labels
    ran together ('0 0'). Measured in the drawn figure's pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    # Each bar's (device, left pixel, right pixel).
    pixels = [(d, *ax.transData.transform([(s, 0), (e, 0)])[:, 0]) for _, d, s, e in labels]
    for i, (text, *_) in enumerate(labels):
        device, left, right = pixels[i]
        box = text.get_window_extent(renderer)
        covered = any(d == device and x0 < box.x1 and box.x0 < x1 for d, x0, x1 in pixels[i + 1 :])
        if box.width + 2 > right - left or covered:
            text.remove()


def _Save(fig: Any, path: str) -> str:
    """Writes `fig` as PNG to `path` through tf.io.gfile; returns the path."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buffer.getvalue())
    return path


def _Title(what: str, sched: Schedule) -> str:
    return f"{what}: {sched.name}, K={sched.num_devices}, M={sched.num_micro_batches}"


def PlotSimulation(sched: Schedule, sim: Any, path: str, title: str | None = None) -> str:
    """Draws the plan: `sim` (simulate.Simulate(sched)) in its time units, to `path` (PNG)."""
    bars = [(sched.DeviceOf(a.stage), sim.start[a], sim.end[a], a) for a in sim.order]
    title = title or f"{_Title('plan', sched)}; bubble {sim.bubble:.1%} (simulated, F=1, B=2)"
    return _Save(_Figure(sched, bars, "time units", title), path)


def PlotSpans(spans: Sequence[Any], sched: Schedule, path: str, title: str | None = None) -> str:
    """Draws measured spans (timeline.Span: device, action, start_us, end_us) to `path`.

    Several recorded steps lie one after another on the same time axis, in ms.
    """
    if not spans:
        raise ValueError(
            f"plot.PlotSpans: expected at least one span to draw, received none ({path})"
        )
    bars = [(s.device, s.start_us / 1e3, s.end_us / 1e3, s.action) for s in spans]
    title = title or f"{_Title('measured', sched)}, {len({s.step for s in spans})} step(s)"
    return _Save(_Figure(sched, bars, "ms from the first recorded action", title), path)

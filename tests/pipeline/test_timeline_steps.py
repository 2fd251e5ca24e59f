"""A profiled run's timeline holds exactly the profiled steps: ops that the profile files
under an executor run of their own (a few of one backward) join the step they ran in,
instead of making a phantom step; and a picture labels only the bars its label fits."""

from tensorflow.tsl.profiler.protobuf import xplane_pb2

from lingpipe import test_utils
from lingpipe.pipeline.observe import plot, timeline
from lingpipe.pipeline.schedules import generators
from lingpipe.pipeline.schedules.schedule import Action

PROCESS = "ExecutorState::Process"
US = 1_000_000  # picoseconds


class _Plane:
    """Builds the host plane of an XSpace: executor runs holding op events."""

    def __init__(self) -> None:
        self.space = xplane_pb2.XSpace()
        self.plane = self.space.planes.add(name="/host:CPU")
        self.plane.stat_metadata[1].name = "id"
        self.line = self.plane.lines.add(id=1, timestamp_ns=0)
        self._names: dict[str, int] = {}

    def _Event(self, name: str, start_us: float, dur_us: float, step_id: int | None = None):
        if name not in self._names:
            self._names[name] = len(self._names) + 1
            self.plane.event_metadata[self._names[name]].name = name
        ev = self.line.events.add(
            metadata_id=self._names[name],
            offset_ps=int(start_us * US),
            duration_ps=int(dur_us * US),
        )
        if step_id is not None:
            ev.stats.add(metadata_id=1, int64_value=step_id)

    def Run(self, step_id: int, start_us: float, ops: list[str]) -> float:
        """An executor run of `ops`, 10 us each one after another; returns its end."""
        self._Event(PROCESS, start_us, 10 * len(ops) + 1, step_id)
        for i, name in enumerate(ops):
            self._Event(name, start_us + 10 * i + 0.5, 9)
        return start_us + 10 * len(ops) + 1


def _Ops(action: Action) -> list[str]:
    scope = f"F_s{action.stage}_mb{action.micro_batch}"
    if action.kind == "F":
        return [f"{scope}/MatMul:MatMul"]
    return [f"gradient_tape/{scope}/MatMul_grad/MatMul:MatMul"]


def test_ops_of_another_executor_run_join_their_step_not_a_phantom_one():
    sched = generators.Make("gpipe", 2, 2)
    plane = _Plane()
    actions = [a for acts in sched.device_actions for a in acts]
    # The tail of the step before the profiled ones: dropped.
    end = plane.Run(7, 0, _Ops(Action("B", 0, 0)))
    for step_id in (101, 202):
        end = plane.Run(step_id, end + 5, [op for a in actions for op in _Ops(a)])
    # Two more ops of step 202's backward of stage 0, micro-batch 1, under another id.
    plane.Run(303, end + 1, _Ops(Action("B", 0, 1)) * 2)

    spans = timeline.Spans(plane.space, sched)

    assert sorted({s.step for s in spans}) == [0, 1]
    assert timeline.Compare(spans, sched).startswith("Timeline of 2 step(s)")
    for step in (0, 1):
        for d in range(sched.num_devices):
            assert test_utils.DeviceOrder(spans, step, d) == list(sched.device_actions[d])
    ops = {(s.step, str(s.action)): s.num_ops for s in spans}
    assert ops[(1, "B s0 mb1")] == 3 and ops[(0, "B s0 mb1")] == 1
    assert ops[(0, "B s0 mb0")] == 1  # not the earlier step's tail
    assert len(spans) == 2 * len(actions)


def test_profile_of_partial_steps_only_keeps_its_ids():
    """Without a step that ran every forward there is nothing to join to."""
    sched = generators.Make("gpipe", 2, 2)
    plane = _Plane()
    plane.Run(5, 0, _Ops(Action("F", 0, 0)) + _Ops(Action("B", 0, 0)))
    spans = timeline.Spans(plane.space, sched)
    assert [(s.step, str(s.action)) for s in spans] == [(0, "F s0 mb0"), (0, "B s0 mb0")]


def test_a_label_is_drawn_only_where_it_fits_its_bar():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    sched = generators.Make("gpipe", 1, 12)
    # Micro-batch 10's bar is 1.3% of the chart: room for "1", not for "10".
    widths = [100.0] * 10 + [1.3 * 11, 100.0]
    starts = [sum(widths[:m]) for m in range(12)]
    bars = [(0, starts[m], starts[m] + widths[m], Action("F", 0, m)) for m in range(12)]
    fig = plot._Figure(sched, bars, "us", "labels")
    ax = fig.axes[0]
    drawn = {t.get_text(): t for t in ax.texts}
    assert sorted(drawn, key=int) == [str(m) for m in range(12) if m != 10]
    renderer = FigureCanvasAgg(fig).get_renderer()
    for m, text in ((int(k), t) for k, t in drawn.items()):
        left, right = ax.transData.transform([(starts[m], 0), (starts[m] + widths[m], 0)])[:, 0]
        box = text.get_window_extent(renderer)
        assert left <= box.x0 and box.x1 <= right, m


def test_a_label_under_a_later_bar_is_not_drawn():
    """Measured spans overlap (a forward whose first op ran early): the backward drawn
    over the forward's middle hides its bar, so only the backward's label is drawn."""
    sched = generators.Make("gpipe", 1, 1)
    bars = [(0, 0.0, 100.0, Action("F", 0, 0)), (0, 20.0, 100.0, Action("B", 0, 0))]
    fig = plot._Figure(sched, bars, "us", "overlap")
    assert [(t.get_text(), t.get_position()[0]) for t in fig.axes[0].texts] == [("0", 60.0)]

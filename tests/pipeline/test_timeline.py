"""The measured timeline: a profiled pipelined step gives one span per action, on its
stage's device, in the schedule's order; Chrome trace and pictures of plan and
measurement; errors that say what was expected."""

import json

import pytest
import tensorflow as tf
from gpipe_cells import Pipeline

from lingpipe import test_utils
from lingpipe.layers import linear
from lingpipe.nested_map import NestedMap
from lingpipe.pipeline.observe import plot, timeline
from lingpipe.pipeline.schedules import cli, generators, simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _Loss(outputs, unused_loss_inputs):
    return NestedMap(loss=(tf.reduce_mean(tf.square(outputs)), 1.0))


def _MlpStep(cells: int, micro_batches: int, batch: int):
    """(pipeline, traced training step) of `cells` 64-wide projections on K=2, 1F1B."""
    cell = linear.ProjectionLayer.Params().Set(input_dims=64, output_dims=64, activation="TANH")
    pipe = Pipeline([cell] * cells, 2, micro_batches, remat="never", schedule="1f1b")
    x = tf.random.stateless_normal([batch, 64], seed=[1, 2])

    @tf.function(autograph=False)
    def Step():
        r = pipe.ForwardBackward(pipe.theta, x, _Loss)
        return r.metrics.loss[0], r.theta_grads

    return pipe, Step


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(schedule, spans) of two profiled 1F1B steps of a 4-cell MLP on K=2, M=4."""
    pipe, Step = _MlpStep(cells=4, micro_batches=4, batch=64)
    logdir = str(tmp_path_factory.mktemp("timeline"))
    return pipe.Schedule(), timeline.Record(Step, logdir, pipe, num_steps=2)


def test_1f1b_span_order_per_device_is_the_schedules_list(recorded):
    sched, spans = recorded
    assert {s.step for s in spans} == {0, 1}
    for step in (0, 1):
        for d in range(sched.num_devices):
            assert test_utils.DeviceOrder(spans, step, d) == list(sched.device_actions[d])
    for s in spans:
        assert s.device == s.action.stage % 2 and s.end_us >= s.start_us >= 0
        assert 0 < s.busy_us <= s.duration_us + 1e-6


def test_chrome_trace_busy_share_and_pictures(recorded, tmp_path):
    sched, spans = recorded
    trace = json.loads(json.dumps(timeline.ChromeTrace(spans, sched)))
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(spans) == 2 * 2 * 2 * 4
    assert {e["name"] for e in complete} >= {"F s1 mb3", "B s0 mb2"}
    assert all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in trace["traceEvents"])
    busy = timeline.BusyShare(spans, 2)
    assert all(0 < b <= 1 for b in busy)
    text = timeline.Compare(spans, sched)
    assert "device 1: busy" in text and "simulated idle" in text
    paths = timeline.Write(f"ram://{tmp_path}/run", spans, sched)  # through tf.io.gfile
    assert paths[0].endswith("/timeline.json") and paths[1].endswith("/timeline.png")
    with tf.io.gfile.GFile(paths[1], "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_schedule_main_draws_the_plan(tmp_path, capsys):
    path = str(tmp_path / "plan.png")
    args = ["--schedule=zero_bubble", "--num_stages=3", "--num_micro_batches=4", f"--png={path}"]
    assert cli.main(args) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_errors_say_what_was_expected(tmp_path):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    sched = generators.Make("gpipe", 2, 2)
    with pytest.raises(timeline.TimelineError, match=r"no op of a pipeline action .* F_s0_mb0/"):
        timeline.Spans(xplane_pb2.XSpace(), sched)
    with pytest.raises(timeline.TimelineError, match=r"no profile in .*xplane.pb"):
        timeline.LatestProfile(str(tmp_path))
    with pytest.raises(ValueError, match=r"expected at least one span.*received none"):
        plot.PlotSpans([], sched, str(tmp_path / "x.png"))
    with pytest.raises(ValueError, match=r"expected num_steps >= 1, received 0"):
        timeline.Record(lambda: None, str(tmp_path), sched, num_steps=0)
    plot.PlotSimulation(sched, simulate.Simulate(sched), str(tmp_path / "plan.png"))


@pytest.mark.grappler
def test_the_first_stage_computes_no_gradient_of_the_pipeline_s_inputs(tmp_path):
    # What planner.FirstStageWithoutInputGradient counts on: the executor asks each
    # stage for its inputs' gradient, and Grappler (TensorFlow's graph optimizer, on in
    # every run but the tests') drops the first stage's, which nothing reads. One
    # projection a stage: stage 0's backward runs its weights' matmul alone, stage 1's
    # that and its inputs' (read from the profiled ops).
    import collections
    import re

    pipe, Step = _MlpStep(cells=2, micro_batches=2, batch=16)
    timeline.Record(Step, str(tmp_path), pipe, num_steps=1)
    space = timeline.ReadXSpace(timeline.LatestProfile(str(tmp_path)))
    matmuls = collections.Counter()
    for plane in (p for p in space.planes if p.name == "/host:CPU"):
        for line in plane.lines:
            for ev in line.events:
                op, _, kind = plane.event_metadata[ev.metadata_id].name.partition(":")
                found = re.search(r"_s(\d)_mb\d+/", op)
                if "MatMul" in kind and "gradient" in op and found:
                    matmuls[int(found.group(1))] += 1
    assert matmuls == {0: 1 * 2, 1: 2 * 2}  # per stage, over the step's 2 micro-batches

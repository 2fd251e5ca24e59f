"""Measured idle share per device beside the schedule simulation's, for each schedule.

    python bench/timeline.py     # table + bench/results/timeline.json (+ one PNG per schedule)

One process per schedule: K=2 logical CPU devices, M=8 micro-batches, intra_op=1
and inter_op=K (one thread per stage), the speed MLP (8 cells of
512 x 512, batch 512), remat 'never'. Each process profiles 3 training steps
(`PipeliningLayer.ForwardBackward` in a tf.function, after one unprofiled step)
with lingpipe.pipeline.observe.timeline.Record. `idle` is the share of the steps' time
in which no op of the device's actions ran; `sim_idle` is the simulation's
(F=1, B=2, I=W=1 time units). CPU figures are shares, not speeds: a benchmark,
never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

K, M, STEPS = 2, 8, 3
SCHEDULES = (
    ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1), ("zbv", 1),
    ("looped_bfs", 2), ("interleaved_zero_bubble", 2), ("dualpipev", 1),
)  # fmt: skip
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def Child(schedule: str, virtual: int) -> dict:
    """Profiles STEPS steps of `schedule`; per device the measured and simulated idle share."""
    common.UseSpeedSizes()
    common.Setup(K, intra_op=1, inter_op=K)
    import tensorflow as tf

    from lingpipe.layers import gpipe
    from lingpipe.nested_map import NestedMap
    from lingpipe.pipeline.observe import timeline
    from lingpipe.pipeline.schedules import simulate

    pipe = (
        gpipe.PipeliningLayer.Params()
        .Set(name="pipe", cell_tpl=common.CellParams("mlp"), num_stages=K)
        .Set(num_micro_batches=M, remat="never", schedule=schedule, num_virtual_stages=virtual)
        .Instantiate()
    )
    (x,) = common.Inputs("mlp")

    def Loss(outputs, unused):
        return NestedMap(loss=(tf.reduce_mean(tf.square(outputs)), 1.0))

    @tf.function(autograph=False)
    def Step():
        r = pipe.ForwardBackward(pipe.theta, x, Loss)
        return r.metrics.loss[0], r.theta_grads

    sched = pipe.Schedule()
    with tempfile.TemporaryDirectory() as logdir:
        spans = timeline.Record(Step, logdir, pipe, num_steps=STEPS)
    png = os.path.join(RESULTS, f"timeline_{schedule}.png")
    from lingpipe.pipeline.observe import plot

    plot.PlotSpans([s for s in spans if s.step == STEPS - 1], sched, png)
    busy = timeline.BusyShare(spans, K)
    sim = simulate.Simulate(sched)
    step_ms = [
        (
            max(s.end_us for s in spans if s.step == i)
            - min(s.start_us for s in spans if s.step == i)
        )
        / 1e3
        for i in range(STEPS)
    ]
    return {
        "schedule": schedule if virtual == 1 else f"{schedule} v={virtual}",
        "idle": [1 - b for b in busy],
        "sim_idle": sim.idle_share,
        "pipeline_ms": sum(step_ms) / len(step_ms),
        "png": png,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--schedule", default="gpipe")
    ap.add_argument("--virtual", type=int, default=1)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(Child(args.schedule, args.virtual)))
        return
    rows = []
    for name, virtual in SCHEDULES:
        out = common.RunChild(__file__, [f"--schedule={name}", f"--virtual={virtual}"])
        if "error" in out:
            rows.append({"schedule": name, "error": " ".join(out["error"])})
            continue
        for d in range(K):
            rows.append(
                {
                    "schedule": out["schedule"],
                    "device": d,
                    "idle": out["idle"][d],
                    "sim_idle": out["sim_idle"][d],
                    "pipeline_ms": out["pipeline_ms"],
                }
            )
    columns = ["schedule", "device", "idle", "sim_idle", "pipeline_ms", "error"]
    print(f"K={K}, M={M}, intra_op=1, inter_op={K}, speed MLP, remat never, {STEPS} steps")
    print(common.Table(rows, columns))
    payload = {"machine": common.Machine(), "K": K, "M": M, "steps": STEPS, "rows": rows}
    common.WriteJson(os.path.join(RESULTS, "timeline.json"), payload)


if __name__ == "__main__":
    main()

"""Step time of each pipeline schedule, beside its simulated bubble.

    python bench/schedules.py              # table + bench/results/schedules.json
    python bench/schedules.py --simulated  # every schedule's simulated figures only:
                                           # bench/results/schedules_simulated.json

`--simulated` runs no model: each schedule at K=4, M=8 (`--stages`,
`--micro_batches`) under unit costs (F = I = W = 1, B = 2) through
lingpipe.pipeline.schedules.simulate, giving its bubble, makespan and peak alive micro-batches
per device (all of a device's stages together, so a V-shaped or interleaved
schedule's two half-size stages count twice).

A training step (ForwardBackward: the executor runs the schedule) of the MLP and
transformer benchmark models (bench/common.py's speed sizes, 8 cells each) for
each schedule at K = 2 and 4 stages, M = 8 micro-batches, remat 'always', with
intra_op=1 and inter_op=K so that stages run side by side, one thread each (on a
2-core CPU TensorFlow's default pools already use both cores inside every op,
leaving a pipeline nothing to gain). Each row is one process. The plain stack
(all cells, one thread) is the baseline; `bubble` is the simulated idle share of
the schedule with unit costs (F = I = W = 1, B = 2). CPU timings are ratios only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

SCHEDULES = [
    ("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1), ("zbv", 1),
    ("looped_bfs", 2), ("interleaved_zero_bubble", 2), ("dualpipev", 1), ("v_half", 1),
    ("v_min", 1),
]  # fmt: skip


def _Step(layer, schedule: str):
    import tensorflow as tf

    from lingpipe.nested_map import NestedMap

    def Loss(outputs, _):
        return NestedMap(loss=(tf.reduce_mean(tf.square(outputs)), tf.constant(1.0)))

    @tf.function(autograph=False)
    def Step(*inputs):
        if schedule == "plain":
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(layer(*inputs)))
            return loss, tape.gradient(loss, layer.trainable_variables)
        result = layer.ForwardBackward(layer.theta, inputs, Loss)
        return result.metrics.loss[0], result.theta_grads

    return Step


def Child(model: str, stages: int, micro: int, schedule: str, v: int, steps: int) -> dict:
    common.UseSpeedSizes()
    # Interleaving K=4 by v=2 needs 8 cells: every row of this table runs 8.
    common.MODELS[model]["cells"] = max(common.MODELS[model]["cells"], 8)
    k = max(stages, 1)
    common.Setup(k, intra_op=1, inter_op=max(k, 2))
    import tensorflow as tf

    from lingpipe.layers import gpipe, sequential
    from lingpipe.pipeline.schedules import generators, simulate

    cells = common.CellParams(model)
    if schedule == "plain":
        layer = sequential.SequentialLayer.Params().Set(name="plain", sub=cells).Instantiate()
        bubble = 0.0
    else:
        layer = (
            gpipe.PipeliningLayer.Params()
            .Set(name="pipe", cell_tpl=cells, num_stages=stages, num_micro_batches=micro,
                 remat="always", schedule=schedule, num_virtual_stages=v)
            .Instantiate()
        )  # fmt: skip
        bubble = simulate.Simulate(generators.Make(schedule, stages, micro, v)).bubble
    inputs = common.Inputs(model)
    step = _Step(layer, schedule)
    for _ in range(2):
        tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))
        times.append(time.perf_counter() - start)
    return {"ms": 1000 * statistics.median(times), "bubble": bubble}


def Simulated(k: int, m: int) -> list[dict]:
    """Each schedule's simulated figures at K devices and M micro-batches (unit costs)."""
    from lingpipe.pipeline.schedules import generators, simulate

    rows = []
    for name in generators.SCHEDULES:
        v = 2 if name in generators.VIRTUAL and name != "forward_only" else 1
        sched = generators.Make(name, k, m, v)
        sim = simulate.Simulate(sched)
        rows.append(
            {
                "schedule": name,
                "stages_per_device": sched.num_virtual_stages,
                "placement": "V" if name in generators.V_SHAPED else "loop",
                "bubble": f"{sim.bubble:.1%}",
                "makespan": int(sim.makespan),
                "peak_alive_per_device": "/".join(map(str, sim.device_peak_alive)),
                "peak_alive_device_0": sim.device_peak_alive[0],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--micro_batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--config", default="", help=argparse.SUPPRESS)
    ap.add_argument("--simulated", action="store_true", help="simulated figures only, no runs")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "schedules.json")
    )
    args = ap.parse_args()
    if args.child:
        k, m, schedule, v = args.config.split(":")
        row = Child(args.models, int(k), int(m), schedule, int(v), args.steps)
        print(json.dumps(row))
        return
    if args.simulated:
        k = int(args.stages.split(",")[-1])
        rows = Simulated(k, args.micro_batches)
        print(f"K={k} devices, M={args.micro_batches} micro-batches, F = I = W = 1, B = 2:")
        print(common.Table(rows, list(rows[0])))
        out = args.out.replace("schedules.json", "schedules_simulated.json")
        common.WriteJson(out, {"k": k, "m": args.micro_batches, "rows": rows})
        print(f"wrote {out}")
        return
    rows = []
    for model in args.models.split(","):
        configs = [(1, 1, "plain", 1)]
        for k in map(int, args.stages.split(",")):
            configs += [(k, args.micro_batches, s, v) for s, v in SCHEDULES]
        base = None
        for k, m, schedule, v in configs:
            config = f"--config={k}:{m}:{schedule}:{v}"
            flags = [f"--models={model}", f"--steps={args.steps}", config]
            row = common.RunChild(__file__, flags)
            row.update(model=model, stages=k if schedule != "plain" else "plain",
                       micro_batches=m, schedule=schedule, virtual_stages=v)  # fmt: skip
            base = row if schedule == "plain" else base
            if base and "ms" in row and "ms" in base:
                row["vs_plain"] = row["ms"] / base["ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    columns = ["model", "stages", "micro_batches", "schedule", "virtual_stages", "bubble", "ms",
               "vs_plain"]  # fmt: skip
    print(common.Table(rows, columns))
    common.WriteJson(args.out, {"machine": common.Machine(), "threads": "intra1_interK",
                                "rows": rows})  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Two configurations timed in turn, for the comparisons that a grid's one reading each
cannot settle (issue 29's picks and partition targets).

    python bench/pairs.py          # bench/results/pairs.json and a table (about 10 min)

bench/plan.py times each configuration once, 5 steps, one after another over an hour;
on this 2-core VM the same configuration measured twice differs by a median of 4%,
and by up to a quarter, as other load comes and goes. A 20% gap between two rows can
be that noise. Here the two configurations of a pair are built side by side in one
process and timed in turn, ROUNDS rounds of STEPS steps each, the order alternating,
so that both see the same machine; each round gives a ratio, and the pair's ratio is
their median (the spread beside it).

Pairs:
- `partition`: the cost-based ('flops') against the uniform partition, 1F1B, remat
  never, M in 4, 8, 16, on the 32k LM of bench/plan.py (2 layers: its softmax is
  97% of the FLOPs, so either cut leaves it on one stage with at most one small layer
  beside it) and on `lm32k_deep` (12 layers whose FLOPs together come near the
  softmax's: the uniform cut puts five of them beside it). With each, the planner's
  predicted ratio (profiled costs, bench/plan.py's rates).
- `pick`: per model and cap of bench/results/plan.json's picks, the planner's pick
  against the best measured configuration that fits, both read from its rows.

A benchmark, never a test.
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

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ROUNDS, STEPS = 6, 3
PARTITION_MODELS = ("lm32k", "lm32k_deep")
PARTITION_M = (4, 8, 16)


def Duel(first, second, rounds: int = ROUNDS, steps: int = STEPS) -> dict:
    """`first` and `second` (step functions) timed in turn: per round the median of
    `steps` steps of each, the order alternating; the ratio second / first per round."""
    for step in (first, second, first, second):
        step().numpy()  # traced and warm: two untimed calls each, as bench/plan.py
    times: dict = {0: [], 1: []}
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for which in order:
            step = (first, second)[which]
            seconds = []
            for _ in range(steps):
                start = time.perf_counter()
                step().numpy()
                seconds.append(time.perf_counter() - start)
            times[which].append(statistics.median(seconds))
    ratios = [b / a for a, b in zip(times[0], times[1])]
    return dict(
        first_s=statistics.median(times[0]),
        second_s=statistics.median(times[1]),
        ratio=statistics.median(ratios),
        ratio_min=min(ratios),
        ratio_max=max(ratios),
    )


def _Candidate(row: dict):
    from lingpipe.pipeline.planning import planner

    return planner.Candidate(
        row["R"], row["K"], row["M"], row["schedule"], row["v"], row["remat"],
        tuple(row["cells"]), row["partition"],
    )  # fmt: skip


def _Builder(model: str):
    """A function from a plan.json row to that configuration's step function."""
    from bench import plan

    if model != "keras":
        pipe_p, inputs, loss_fn = plan.Model(model)
        return lambda row: plan.BuildStep(pipe_p, inputs, loss_fn, _Candidate(row))[0]
    import keras

    import lingpipe.keras as lpk

    def Build(row: dict):
        fresh, x, y = plan.KerasModel()
        c = _Candidate(row)
        piped = lpk.Pipeline(fresh, devices=list(plan.DEVICES[: c.num_stages]), **c.Settings())
        piped.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return lambda: plan._Loss(piped.train_on_batch(x, y))  # noqa: SLF001

    return Build


def PartitionChild(model: str) -> list:
    """The 'flops' and 'uniform' partitions of `model` under 1F1B: predicted and timed."""
    import tensorflow as tf

    from bench import plan
    from lingpipe.pipeline.planning import costs as costs_lib
    from lingpipe.pipeline.planning import planner

    pipe_p, inputs, loss_fn = plan.Model(model)
    batch = tf.nest.flatten(inputs)[0].shape[0]
    specs = tuple(pipe_p.input_shapes)
    metas = costs_lib.CellMetas(pipe_p, pipe_p.cell_tpl, specs)
    sizes = sorted({batch // max(PARTITION_M), batch // min(PARTITION_M)})
    counts = costs_lib.WeightCounts(pipe_p, pipe_p.cell_tpl)
    costs = plan.ProfiledCosts(pipe_p, metas, counts, batch, sizes)
    rates = planner.MeasureRates(plan.DEVICES[0])
    cuts = dict(planner.Partitions(costs, 2))
    flops_share = max(m.flops for m in metas) / sum(m.flops for m in metas)
    rows = []
    for m in PARTITION_M:
        steps, predicted = {}, {}
        for policy in ("flops", "uniform"):
            c = planner.Candidate(1, 2, m, "1f1b", 1, "never", tuple(cuts[policy]), policy)
            predicted[policy] = planner.PredictSeconds(c, costs, rates, batch)
            steps[policy] = plan.BuildStep(pipe_p, inputs, loss_fn, c)[0]
        duel = Duel(steps["flops"], steps["uniform"])
        rows.append(
            dict(
                pair="partition", model=model, M=m,
                first=f"flops {list(cuts['flops'])}", second=f"uniform {list(cuts['uniform'])}",
                predicted_ratio=predicted["uniform"] / predicted["flops"],
                largest_cell_flops_share=flops_share, **duel,
            )
        )  # fmt: skip
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def PickChild(model: str, picks: list, rows: list) -> list:
    """Each pick of `model` against the best measured configuration that fits its cap."""
    from bench import plan

    build = _Builder(model)
    by_name = {plan._Name(r): r for r in rows if r["model"] == model}  # noqa: SLF001
    out = []
    for p in picks:
        pick, best = by_name[p["pick"]], by_name[p["best"]]
        row = dict(pair="pick", model=model, cap_mib=p["cap_mib"])
        row.update(first=p["pick"], second=p["best"])
        row["predicted_ratio"] = best["calibrated_s"] / pick["calibrated_s"]
        row["grid_ratio"] = best["measured_s"] / pick["measured_s"]
        if p["pick"] == p["best"]:
            out.append(dict(row, ratio=1.0, pick_vs_best=0.0, same=True))
            continue
        duel = Duel(build(pick), build(best))
        out.append(dict(row, **duel, pick_vs_best=1 / duel["ratio"] - 1))
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model", default="lm32k")
    ap.add_argument("--what", default="partition", choices=("partition", "pick"))
    ap.add_argument("--plan", default=os.path.join(RESULTS, "plan.json"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "pairs.json"))
    ap.add_argument("--only", default=None, help="'partition' or 'pick': one kind of pair")
    args = ap.parse_args(argv)
    with open(args.plan, encoding="utf-8") as f:
        grid = json.load(f)
    if args.child:
        common.Setup(2, intra_op=1, inter_op=2)
        if args.what == "partition":
            got = PartitionChild(args.model)
        else:
            picks = [p for p in grid["picks"] if p["model"] == args.model]
            got = PickChild(args.model, picks, grid["rows"])
        print(json.dumps(dict(rows=got)))
        return 0
    jobs = []
    if args.only in (None, "partition"):
        jobs += [("partition", m) for m in PARTITION_MODELS]
    if args.only in (None, "pick"):
        jobs += [("pick", m) for m in sorted({p["model"] for p in grid["picks"]})]
    rows, errors = [], []
    for what, model in jobs:
        print(f"{what}: {model} ...", flush=True)
        got = common.RunChild(
            __file__, [f"--what={what}", f"--model={model}", f"--plan={args.plan}"], 3600
        )
        if "error" in got:
            errors.append(dict(pair=what, model=model, error=" ".join(got["error"])))
            continue
        rows += got["rows"]
    payload = dict(
        machine=common.Machine(),
        rounds=ROUNDS,
        steps=STEPS,
        plan_json_date=grid["date"],
        rows=rows + errors,
    )
    common.WriteJson(args.out, payload)
    columns = ["pair", "model", "M", "cap_mib", "first", "second", "predicted_ratio", "ratio",
               "ratio_min", "ratio_max"]  # fmt: skip
    print(common.Table(rows + errors, columns))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

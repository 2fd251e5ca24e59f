"""GPipe's capacity table (Table 1 of the GPipe paper) on this machine: the largest
Transformer stack (parameters) that trains within a per-device memory cap.

    python bench/capacity.py                  # table + bench/results/capacity.json
    python bench/capacity.py --size=smoke     # the seconds-long configuration of the tests

Rows: one device without recompute (naive: M=1, remat 'never'), one device with
recompute and micro-batches (remat 'always'), and K = 2, 4, 8 stages (GPipe's
fill-drain, remat 'always'). The stack grows in depth (layers of a fixed width)
until a device's step would pass the cap.

On a GPU (`--mode=gpu`, the default when one is visible) each probe runs in its own
process that splits GPU 0 into K logical GPUs of `--cap_mib` each
(`tf.config.set_logical_device_configuration` with `memory_limit`) and trains two
steps with Adam: an out-of-memory is real; a binary search over the depth finds
the largest that runs. Without a GPU (`--mode=estimate`) the depth is searched with
lingpipe.pipeline.observe.memory's estimate of each stage's training step (Adam's slots
included), and for the configurations small enough to run here the estimate is
checked against the measured peak of the step on CPU (no optimizer on either
side; one allocator serves every logical CPU device, so totals are compared).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

MIB = 1024 * 1024
SIZES = {
    # The memory benchmark's transformer layer; 256 MiB per device.
    "cpu": dict(dims=256, heads=4, hidden=1024, batch=32, time=128, micro=8, cap_mib=256),
    # Seconds: the test suite's smoke run.
    "smoke": dict(dims=128, heads=2, hidden=256, batch=16, time=128, micro=4, cap_mib=32),
    # A Transformer-big-like layer on 8 logical GPUs of 8 GiB (one H100).
    "gpu": dict(dims=1024, heads=16, hidden=4096, batch=32, time=256, micro=8, cap_mib=8192),
    # bench/gpu.py's nine minutes on one H100: the same layer on 8 logical GPUs of 2 GiB
    # at M=4. A probe's graph grows with layers x micro-batches and takes longer to
    # build than to run: here the estimate's depths are 2 (naive) to 40 (K=8), not 240.
    "gpu_quick": dict(dims=1024, heads=16, hidden=4096, batch=32, time=256, micro=4, cap_mib=2048),
}
# (row name, stages K, micro-batches or None for the size's M, remat)
ROWS = [
    ("naive, 1 device", 1, 1, "never"),
    ("recompute, 1 device", 1, None, "always"),
    ("pipeline K=2", 2, None, "always"),
    ("pipeline K=4", 4, None, "always"),
    ("pipeline K=8", 8, None, "always"),
]


def Pipeline(cfg: dict, layers: int, stages: int, micro: int, remat: str, devices=None):
    """The params of a PipeliningLayer of `layers` causal Transformer layers."""
    from lingpipe.layers import gpipe, transformer

    cell = transformer.TransformerLayer.Params().Set(
        input_dims=cfg["dims"], num_heads=cfg["heads"], hidden_dims=cfg["hidden"], causal=True
    )
    return gpipe.PipeliningLayer.Params().Set(
        name="pipe",
        cell_tpl=[cell.Copy() for _ in range(layers)],
        num_stages=stages,
        num_micro_batches=micro,
        remat=remat,
        devices=devices,
        input_shapes=[[cfg["batch"], cfg["time"], cfg["dims"]]],
    )


def Estimate(cfg: dict, layers: int, stages: int, micro: int, remat: str, slots: float):
    """lingpipe.pipeline.observe.memory's per-stage estimate, from params alone (nothing built)."""
    from lingpipe.pipeline.observe import memory
    from lingpipe.pipeline.planning import partition
    from lingpipe.pipeline.schedules import generators

    p = Pipeline(cfg, layers, stages, micro, remat)
    bounds = partition.Boundaries(partition.MinMaxPartition([1.0] * layers, stages))
    sched = generators.Make("gpipe", stages, micro)
    pairs = {(s, m) for s in range(stages) for m in range(micro)}
    kept = pairs if remat == "never" else set()
    cells = [list(range(a, b)) for a, b in bounds]
    return memory.Estimate(p, p.cell_tpl, cells, tuple(p.input_shapes), sched, kept, slots)


def Largest(fits, low: int, start: int | None = None) -> int:
    """The largest n >= low with fits(n) (fits is monotone), or 0 if fits(low) is False.

    Without `start` the search doubles from low, then bisects. With `start` (a guess,
    such as the estimate's depth) it gallops from there, up by 1, 2, 4, ... while n
    fits or down by 1, 2, 4, ... (not below low) while it does not, then bisects: a
    guess d layers off costs about 2 log2(d) probes instead of 2 log2(n).
    """
    if start is None or start <= low:
        if not fits(low):
            return 0
        hi = low
        while fits(hi * 2):
            hi *= 2
        lo, hi = hi, hi * 2  # fits(lo), not fits(hi)
    elif fits(start):
        lo, step = start, 1
        while fits(lo + step):
            lo, step = lo + step, step * 2
        hi = lo + step
    else:
        hi, step = start, 1
        while hi - step > low and not fits(hi - step):
            hi, step = hi - step, step * 2
        lo = hi - step
        if lo <= low:
            if not fits(low):
                return 0
            lo = low
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def EstimateRow(cfg: dict, name: str, stages: int, micro: int, remat: str) -> dict:
    cap = cfg["cap_mib"] * MIB

    def Fits(layers: int) -> bool:
        return max(s.total for s in Estimate(cfg, layers, stages, micro, remat, 2)) <= cap

    layers = Largest(Fits, stages)
    row = {"row": name, "stages": stages, "micro_batches": micro, "remat": remat}
    row["layers"] = layers
    if layers:
        per_stage = Estimate(cfg, layers, stages, micro, remat, 2)
        row["params_m"] = sum(s.weights for s in per_stage) / 4 / 1e6
        row["peak_stage_mib"] = max(s.total for s in per_stage) / MIB
    return row


def Measure(cfg: dict, layers: int, stages: int, micro: int, remat: str) -> dict:
    """Child process on CPU: the measured peak of one training step (no optimizer)
    beside the estimate of the same step (no slots)."""
    common.Setup(max(stages, 2))  # With one logical CPU device TF keeps no peak (reads 0).
    import tensorflow as tf

    layer = Pipeline(cfg, layers, stages, micro, remat).Instantiate()
    x = tf.random.stateless_normal([cfg["batch"], cfg["time"], cfg["dims"]], [1, 2])
    step = common.TrainStep(layer, executor=True)
    step(x)  # trace, allocate
    tf.config.experimental.reset_memory_stats("CPU:0")
    step(x)[0].numpy()
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    estimate = layer.PartitionReport().memory_total
    return {
        "measured_mib": peak / MIB,
        "estimate_mib": estimate / MIB,
        "est/measured": estimate / peak,
    }


def Probe(cfg: dict, layers: int, stages: int, micro: int, remat: str) -> dict:
    """Child process on a GPU: K logical GPUs of cap_mib each; two Adam steps, or OOM."""
    import tensorflow as tf

    gpu = tf.config.list_physical_devices("GPU")[0]
    limit = tf.config.LogicalDeviceConfiguration(memory_limit=cfg["cap_mib"])
    tf.config.set_logical_device_configuration(gpu, [limit] * stages)

    devices = [f"/device:GPU:{i}" for i in range(stages)]
    try:
        layer = Pipeline(cfg, layers, stages, micro, remat, devices).Instantiate()
        Train = common.AdamStep(layer)

        with tf.device(devices[0]):
            x = tf.random.stateless_normal([cfg["batch"], cfg["time"], cfg["dims"]], [1, 2])
        for _ in range(2):
            Train(x).numpy()
    except tf.errors.ResourceExhaustedError:
        return {"fits": False}
    peaks = [
        tf.config.experimental.get_memory_info(f"GPU:{i}")["peak"] / MIB for i in range(stages)
    ]
    return {"fits": True, "peak_mib": max(peaks)}


def GpuRow(
    cfg: dict,
    name: str,
    stages: int,
    micro: int,
    remat: str,
    size: str,
    start: int | None = None,
    on_probe=None,
) -> dict:
    """Binary search over depth, one process per probe (an OOM is real). `start`: a first
    guess (see Largest); `on_probe(layers, result)` hears each probe as it ends."""
    seen = {}

    def Fits(layers: int) -> bool:
        if layers not in seen:
            flags = [f"--size={size}", f"--cap_mib={cfg['cap_mib']}", f"--layers={layers}"]
            flags += [f"--stages={stages}", f"--micro={micro}", f"--remat={remat}", "--probe"]
            seen[layers] = common.RunChild(__file__, flags)
            if on_probe:
                on_probe(layers, seen[layers])
        return bool(seen[layers].get("fits"))

    layers = Largest(Fits, stages, start)
    row = {"row": name, "stages": stages, "micro_batches": micro, "remat": remat, "layers": layers}
    if layers:
        per_stage = Estimate(cfg, layers, stages, micro, remat, 2)
        row["params_m"] = sum(s.weights for s in per_stage) / 4 / 1e6
        row["peak_stage_mib"] = seen[layers]["peak_mib"]
    return row


def Table(cfg: dict, mode: str, size: str, measure_max_stages: int) -> list[dict]:
    rows = []
    for name, stages, micro, remat in ROWS:
        micro = micro or cfg["micro"]
        if mode == "gpu":
            row = GpuRow(cfg, name, stages, micro, remat, size)
        else:
            row = EstimateRow(cfg, name, stages, micro, remat)
        if mode != "gpu" and row["layers"] and stages <= measure_max_stages:
            flags = [f"--size={size}", f"--layers={row['layers']}", f"--stages={stages}"]
            flags += [f"--micro={micro}", f"--remat={remat}", f"--cap_mib={cfg['cap_mib']}"]
            row.update(common.RunChild(__file__, flags))
        rows.append(row)
        print(common.Table([row], list(row)), flush=True)
    naive = rows[0].get("params_m")
    for r in rows:
        if naive and r.get("params_m"):
            r["vs_naive"] = r["params_m"] / naive
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="", help=f"one of {', '.join(SIZES)} (default: gpu or cpu)")
    ap.add_argument("--mode", default="", help="gpu or estimate (default: gpu if one is visible)")
    ap.add_argument("--cap_mib", type=int, default=0, help="memory per device (default: size's)")
    ap.add_argument("--measure_max_stages", type=int, default=2, help="measure rows up to this K")
    ap.add_argument("--out", default="", help="JSON path (default bench/results/capacity.json)")
    for hidden in ("layers", "stages", "micro"):
        ap.add_argument(f"--{hidden}", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--remat", default="always", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import json

    import tensorflow as tf

    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    mode = args.mode or ("gpu" if has_gpu else "estimate")
    size = args.size or ("gpu" if mode == "gpu" else "cpu")
    if mode not in ("gpu", "estimate") or size not in SIZES:
        ap.error(
            f"expected --mode in gpu, estimate and --size in {', '.join(SIZES)}; received "
            f"--mode={mode} --size={size}"
        )
    cfg = dict(SIZES[size], cap_mib=args.cap_mib or SIZES[size]["cap_mib"])
    if args.child or args.probe:
        run = Probe if args.probe else Measure
        print(json.dumps(run(cfg, args.layers, args.stages, args.micro, args.remat)))
        return 0
    print(Header(cfg, mode, size))
    rows = Table(cfg, mode, size, args.measure_max_stages)
    columns = ["row", "stages", "micro_batches", "remat", "layers", "params_m", "vs_naive"]
    columns += ["peak_stage_mib", "measured_mib", "estimate_mib", "est/measured"]
    print(common.Table(rows, columns))
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "capacity.json"
    )
    common.WriteJson(out, {"machine": common.Machine(), "mode": mode, "size": cfg, "rows": rows})
    print(f"wrote {out}")
    return 0


def Header(cfg: dict, mode: str, size: str) -> str:
    how = (
        "measured: each probe trains on K logical GPUs with memory_limit, an OOM is real"
        if mode == "gpu"
        else "estimate-based (no GPU): depth searched with "
        "lingpipe.pipeline.observe.memory's estimate (Adam slots included); "
        "measured_mib / estimate_mib check the estimate of the same step without an "
        "optimizer against the CPU allocator's peak (all devices together)"
    )
    return (
        f"capacity ({size}): largest Transformer stack (dims={cfg['dims']}, heads={cfg['heads']}, "
        f"hidden={cfg['hidden']}, batch={cfg['batch']}x{cfg['time']} tokens) within "
        f"{cfg['cap_mib']} MiB per device; {how}"
    )


if __name__ == "__main__":
    raise SystemExit(main())

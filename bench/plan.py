"""The planner's cost model, predicted against measured (issue 29's "Measure").

    python bench/plan.py            # bench/results/plan.json and a table
    python bench/plan.py --quick    # the MLP, a few M and schedules: under a minute

Per model, one process (2 logical CPU devices, intra_op=1, inter_op=2: one thread per
stage) measures the device (planner.MeasureRates: FLOPs, the fixed cost per action,
the sum's and the optimizer's rates per weight byte, the contention of both devices
computing at once), profiles each cell's F, I and W (cell_times.Profile), then for
each configuration of the grid (R x K = 2; M; every
schedule that applies; remat never, except_last, always) builds it, predicts its
training step (lingpipe's Adam included) and its memory, and times 5 steps after one
untimed. R=2 is data parallelism written out: one K=1 pipeline per device, each with
its own weights and Adam slots, the gradients averaged. One configuration (1F1B, M=4)
is recorded with the timeline and the cost model calibrated on it
(lingpipe.pipeline.planning.calibrate); each row holds the uncalibrated and the calibrated
prediction. Memory: one allocator serves both CPU devices, so the measured figure is
the process's peak during the steps less what was in use before the configuration was
built, beside the estimate of one allocator's peak (memory.HostMemory: every stage's
activations at their joint peak over the schedule, not each device's peak added up,
which the row also keeps as devices_sum_mib), times the replicas. Each row records the
host's load average when it was measured: on 2 shared cores other processes decide
how much of a second core the second device gets.

Also: the planner's pick under two caps per model (by the estimate) against the
best measured configuration whose estimate fits; cost-based ('flops') against
uniform partition on the 32k LM; the time to plan a 100-cell MLP.

The Keras model (`keras`: a transformer text classifier written as keras.io's example
writes it) has rows of its own, on a smaller grid (KERAS): lingpipe.keras.Plan's
predictions (its costs are the graph's FLOPs at the measured rate; there is no
profile or calibration of Keras layers) against lingpipe.keras.Pipeline trained with
Adam by train_on_batch, with one replica (K=1: the model on one device).
A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEVICES = ("/device:CPU:0", "/device:CPU:1")
REMATS = ("never", "except_last", "always")
QUICK = dict(
    models=("mlp",),
    micro_batches=(4,),
    schedules=(("1f1b", 1), ("zero_bubble", 1)),
    remats=("never",),
)
FULL = dict(
    models=("lm32k", "mlp", "keras"),
    micro_batches=(1, 2, 4, 8, 16),
    schedules=None,
    remats=REMATS,
)
# The Keras model's grid is smaller: each configuration builds a Keras model anew.
KERAS = dict(
    micro_batches=(1, 2, 4, 8), schedules=("gpipe", "1f1b", "zero_bubble", "zbv"),
    remats=("never", "always"),
)  # fmt: skip


def Model(name: str):
    """(pipeline params, whole-batch inputs, loss_fn) of a model of the grid."""
    import tensorflow as tf

    from lingpipe import model_registry
    from lingpipe.layers import gpipe
    from lingpipe.nested_map import NestedMap

    if name in ("lm32k", "lm32k_deep"):
        p = model_registry.GetParams("lm.TransformerLmTiny", "Train")
        p.vocab_size = 32768  # the embedding and softmax dominate
        if name == "lm32k_deep":
            # 12 layers of a 4x wider feed-forward: the layers weigh about as much as
            # the softmax, so where a stage's cut falls decides the step (bench/pairs.py).
            p.num_layers, p.hidden_dims = 12, 1024
        pipe_p = p.cls.PipelineParams(p)
        shape = pipe_p.input_shapes[0].ids.as_list()
        ids = tf.random.stateless_uniform(shape, [1, 2], 0, 256, dtype=tf.int32)
        ones = tf.ones(shape)
        state = NestedMap(ids=ids, labels=ids, paddings=0 * ones, weights=ones)

        def Loss(out, _):
            total = tf.reduce_sum(out.xent * out.weights)
            return NestedMap(loss=(total / tf.reduce_sum(out.weights), tf.reduce_sum(out.weights)))

        return pipe_p, (state,), Loss
    common.UseSpeedSizes()
    cells = common.CellParams("mlp")
    batch, dims = common.MODELS["mlp"]["batch"], common.MODELS["mlp"]["dims"]
    pipe_p = gpipe.PipeliningLayer.Params().Set(
        name="pipe", cell_tpl=cells, input_shapes=[[batch, dims]]
    )

    def Square(out, _):
        return NestedMap(loss=(tf.reduce_mean(tf.square(out)), 1.0))

    return pipe_p, common.Inputs("mlp"), Square


def Grid(cfg: dict, num_cells: int, batch: int) -> list:
    """R=2 x K=1 (one schedule: the same work in any order) and R=1 x K=2 candidates."""
    from lingpipe.pipeline.planning import planner

    schedules = cfg["schedules"] or planner.SCHEDULES
    grid = []
    for k, names in ((1, (("gpipe", 1),)), (2, schedules)):
        grid += planner.Candidates(
            2, num_cells, batch, names, cfg["remats"], cfg["micro_batches"], stages=(k,)
        )
    return grid


def _Kept(c):
    from lingpipe.pipeline.schedules import generators

    return generators.Make(c.schedule, c.num_stages, c.num_micro_batches, c.num_virtual_stages)


def EstimateDevices(pipe_p, inputs, c, traced_cache: dict) -> tuple[list, int, list]:
    """The estimate of candidate c (Adam's slots): per device of replica 0's pipeline,
    whose devices also receive the other replicas' gradients to average them; one
    pipeline's total in one allocator (memory.HostMemory: there no gradient is copied);
    and per device of a pipeline that receives none (the other replicas', and replica
    0's where R = 1)."""
    from lingpipe import optimizers
    from lingpipe.pipeline.observe import memory
    from lingpipe.pipeline.planning import partition
    from lingpipe.pipeline.step import remat

    sched = _Kept(c)
    specs = tuple(_Specs(x, c.replicas) for x in inputs)
    key = (c.replicas, c.num_micro_batches)
    if key not in traced_cache:
        traced_cache[key] = memory.TracedFor(pipe_p, pipe_p.cell_tpl, specs, c.num_micro_batches)
    bounds = [list(range(a, b)) for a, b in partition.Boundaries(list(c.partition))]

    def PerDevice(replicas: int) -> list[list]:
        stages = memory.Estimate(
            pipe_p,
            pipe_p.cell_tpl,
            bounds,
            specs,
            sched,
            remat.Kept(sched, c.remat),
            optimizers.Adam.Params(),
            traced=traced_cache[key],
            replicas=replicas,
        )
        per_device = [[] for _ in range(c.num_stages)]
        for s, stage in enumerate(stages):
            per_device[sched.DeviceOf(s)].append(stage)
        return per_device

    alone = PerDevice(1)
    own = PerDevice(c.replicas) if c.replicas > 1 else alone
    totals = [[memory.DeviceMemory(ms).total for ms in d] for d in (own, alone)]
    return totals[0], memory.HostMemory(alone), totals[1]


def KerasEstimate(memory, c, batch: int) -> tuple[list[int], int]:
    """The Keras graph's estimate (graph_memory.GraphMemory) per device for candidate c
    over a batch of `batch` rows, and the pipeline's total in one allocator."""
    from lingpipe.pipeline.observe import memory as memory_lib
    from lingpipe.pipeline.planning import partition

    sched = _Kept(c)
    nodes = [list(range(a, b)) for a, b in partition.Boundaries(list(c.partition))]
    stages = memory.Stages(nodes, sched, c.remat, batch)
    by_device = [[m for s, m in enumerate(stages) if sched.DeviceOf(s) == d]
                 for d in range(sched.num_devices)]  # fmt: skip
    per_device = [memory_lib.DeviceMemory(ms).total for ms in by_device]
    return per_device, memory_lib.HostMemory(by_device)


def _Signature(c) -> str:
    """The configuration's work, whatever its name: R, the cells per stage, the recompute
    policy and each device's actions in order. Two rows with the same signature
    (1F1B and GPipe at M=1, say) run the same step: their measured times differ by
    the machine's noise alone."""
    import hashlib

    work = (c.replicas, tuple(c.partition), str(c.remat), str(_Kept(c).device_actions))
    return hashlib.sha1(repr(work).encode()).hexdigest()[:12]


def _Specs(x, replicas: int):
    import tensorflow as tf

    def One(t):
        dims = t.shape.as_list()
        dims[0] //= replicas
        return tf.TensorSpec(dims, t.dtype)

    return tf.nest.map_structure(One, x)


def _Slice(inputs, r: int, replicas: int):
    import tensorflow as tf

    def One(t):
        n = t.shape[0] // replicas
        return t[r * n : (r + 1) * n]

    return tf.nest.map_structure(One, inputs)


def BuildStep(pipe_p, inputs, loss_fn, c, devices=DEVICES):
    """A traced Adam training step of candidate c: R pipelines of K stages (module doc),
    replica r on `devices[r * K : (r + 1) * K]`."""
    import tensorflow as tf

    from lingpipe import optimizers

    pipes, all_devices = [], devices
    for r in range(c.replicas):
        devices = list(all_devices[r * c.num_stages : (r + 1) * c.num_stages])
        p = pipe_p.Copy().Set(name=f"pipe{r}", devices=devices, **c.Settings())
        pipes.append(p.Instantiate())
    variables = [tf.nest.flatten(pipe.theta) for pipe in pipes]
    opts = [optimizers.Adam.Params().Instantiate() for _ in pipes]
    for opt, vs in zip(opts, variables):
        opt.Build(vs)

    @tf.function(autograph=False)
    def Step():
        grads, losses = [], []
        for r, pipe in enumerate(pipes):
            x = _Slice(inputs, r, c.replicas)
            out = pipe.ForwardBackward(pipe.theta, x, loss_fn)
            grads.append(tf.nest.flatten(out.theta_grads))
            losses.append(out.metrics.loss[0])
        mean = []  # each weight's, on replica 0's copy's device (as the trainer averages)
        for v, g in zip(variables[0], zip(*grads)):
            with tf.device(v.device):
                mean.append(None if g[0] is None else g[0] if len(g) == 1 else tf.add_n(g) / len(g))
        for opt, vs in zip(opts, variables):
            opt.Apply(mean, vs, learning_rate=1e-4)
        return tf.add_n(losses)

    return Step, pipes


def Measure(step, steps: int, warm: int = 2) -> tuple[float, float, int]:
    """(median and least seconds of `steps` steps after `warm` untimed, the allocator's
    peak). On a shared VM interference only adds time, so the least is the step
    undisturbed (timeit's reading); the table gives both. A first timed step right
    after one untimed was at times a third slower than the rest: two are untimed."""
    import tensorflow as tf

    for _ in range(warm):
        step().numpy()
    tf.config.experimental.reset_memory_stats("CPU:0")
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step().numpy()
        seconds.append(time.perf_counter() - start)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return statistics.median(seconds), min(seconds), peak


def SecondBuilds(measured: list, builds: list, steps: int, count: int) -> None:
    """Each configuration built and timed again, count - 1 more times, in reverse order
    (at another time of the run than its first build). A step's speed on this shared VM
    varies from build to build, not only from step to step: the MLP's 1F1B step at M=4
    took 36.7 and 42.3 ms in two builds a minute apart, and the grid's worst rows were
    builds 60% slower than the same configuration built again. A row's time is its
    fastest build's (median of its steps; least step of all builds); `builds_s` keeps
    each build's median. Memory is the first build's."""
    for _ in range(count - 1):
        for k in reversed(range(len(measured))):
            row, found = measured[k]
            if found is None:
                continue
            gc.collect()
            try:
                step = builds[k]()
                seconds, best, _ = Measure(step, steps)
                del step
            except Exception as e:  # noqa: BLE001 (the first build's time stands)
                row["builds_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            row.setdefault("builds_s", [found[0]]).append(seconds)
            measured[k] = (row, (min(found[0], seconds), min(found[1], best), *found[2:]))


def _CpuPeak(run):
    """The CPU allocator's AllocatorPeak over `run()` profiled; None where the profile
    holds no memory events."""
    import tensorflow as tf

    from lingpipe.pipeline.observe import allocations, timeline

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        peaks = allocations.Peaks(timeline.ReadXSpace(timeline.LatestProfile(logdir)))
    return max(peaks.values(), key=lambda p: p.peak_bytes) if peaks else None


def ProfiledPeak(step) -> tuple[int, int]:
    """(the most bytes the CPU allocator held, the most its tensors asked for) over one
    more step, profiled (lingpipe.pipeline.observe.allocations): the second leaves out
    the BFC allocator's unsplit chunks, which the first and Measure's peak count."""
    cpu = _CpuPeak(lambda: step().numpy())
    return (cpu.peak_bytes, cpu.requested_bytes) if cpu else (0, 0)


def TensorsPeak(build, steps: int = 3) -> int:
    """The most the tensors of a configuration asked for at once above what the process
    held before, all of it profiled: `build()` (the model built and compiled anew,
    returning its step) and `steps` steps. ProfiledPeak's tensors count what was
    allocated before its profile (the weights, the slots) as the allocator's chunks,
    which BFC sizes up to twice the request from whatever the process freed before: in
    the grid's one process of 40 Keras rows the same zbv step read 5 MiB more than in a
    fresh one. Run after the row's other steps are freed."""
    import tensorflow as tf

    def Run():
        step = build()
        for _ in range(steps):
            step().numpy()

    gc.collect()
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    cpu = _CpuPeak(Run)
    return cpu.requested_bytes - before if cpu else 0


def Calibrate(pipe_p, inputs, loss_fn, costs, rates, c, batch):
    """A calibration (lingpipe.pipeline.planning.calibrate) from 3 recorded steps of each
    of planner.CalibrationProbes(c): c and its 1F1B twin at another M."""
    from lingpipe.pipeline.observe import timeline
    from lingpipe.pipeline.planning import calibrate, planner

    probes = []
    for probe in planner.CalibrationProbes(c, costs, batch):
        step, pipes = BuildStep(pipe_p, inputs, loss_fn, probe)
        sched = pipes[0].Schedule()
        _, unprofiled, _ = Measure(step, 5)
        with tempfile.TemporaryDirectory() as logdir:
            spans = timeline.Record(step, logdir, sched, num_steps=3)
        compute = planner.Compute(probe, costs, rates, batch)
        # The whole step less what the model adds outside the pipeline (the sums'
        # scaling, the optimizer's apply): the pipeline's makespan, unprofiled.
        makespan = max(unprofiled - planner.OutsideSeconds(probe, costs, rates), 1e-9)
        probes.append(calibrate.Probe(spans, sched, compute, makespan))
    return calibrate.FitProbes(probes)


def ProfiledCosts(pipe_p, metas, counts, batch: int, sizes: list):
    """planner.ModelCosts per example of the cells (`metas`, costs.CellMetas; `counts`,
    costs.WeightCounts), their times profiled at `sizes` with B together on the second
    device."""
    from lingpipe.pipeline.planning import cell_times, planner
    from lingpipe.pipeline.planning import costs as costs_lib

    return planner.ModelCosts(
        flops=tuple(float(m.flops) / batch for m in metas),
        out_bytes=tuple(costs_lib.ShapeBytes(m.out_shapes) // batch for m in metas),
        weight_bytes=tuple(4 * int(m.num_params) for m in metas),
        weight_counts=counts,
        times=cell_times.Profile(
            pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes), sizes, partner=DEVICES[1]
        ),
    )


# The threads of the grid's processes: one per device (the default), or TensorFlow's
# own choice, as the trainer and `python -m lingpipe.plan` run unless told otherwise.
THREADS = {"intra1_inter2": dict(intra_op=1, inter_op=2), "default": {}}


def _Setup(threads: str) -> None:
    common.Setup(2, **THREADS[threads])


def Child(
    model: str, cfg: dict, steps: int, threads: str = "intra1_inter2", builds: int = 2
) -> dict:
    _Setup(threads)
    import dataclasses

    import tensorflow as tf

    from lingpipe.pipeline.planning import costs as costs_lib
    from lingpipe.pipeline.planning import planner

    pipe_p, inputs, loss_fn = Model(model)
    batch = tf.nest.flatten(inputs)[0].shape[0]
    metas = costs_lib.CellMetas(pipe_p, pipe_p.cell_tpl, tuple(pipe_p.input_shapes))
    counts = costs_lib.WeightCounts(pipe_p, pipe_p.cell_tpl)
    sizes = sorted({batch // 2 // max(cfg["micro_batches"]), batch // min(cfg["micro_batches"])})

    def Probe():
        return planner.MeasureRates(DEVICES[0]), ProfiledCosts(pipe_p, metas, counts, batch, sizes)

    start = time.perf_counter()
    probes = [Probe()]
    setup_s = time.perf_counter() - start
    rates, costs = probes[0]
    probe = planner.Candidate(1, 2, 4, "1f1b", 1, "never", ())
    probe.partition = planner.Partitions(costs, 2)[0][1]
    cal = Calibrate(pipe_p, inputs, loss_fn, costs, rates, probe, batch)
    configs = []
    for base in Grid(cfg, len(pipe_p.cell_tpl), batch):
        chunks = base.num_stages * (
            2 if base.schedule in ("zbv", "v_half", "v_min") else base.num_virtual_stages
        )
        for policy, counts in planner.Partitions(costs, chunks):
            if policy != "flops" and not (model == "lm32k" and base.schedule == "1f1b"):
                continue  # 'uniform' beside 'flops' only where the issue asks (1F1B, 32k LM)
            configs.append(dataclasses.replace(base, partition=counts, partition_policy=policy))
    measured, traced = [], {}
    for i, c in enumerate(configs):
        if _ProbeDue(i, len(configs)):
            probes.append(Probe())
        measured.append(Row(model, pipe_p, inputs, loss_fn, c, batch, steps, traced))
        print(json.dumps(measured[-1][0]), file=sys.stderr, flush=True)
    steps_of = [lambda c=c: BuildStep(pipe_p, inputs, loss_fn, c)[0] for c in configs]
    SecondBuilds(measured, steps_of, steps, builds)
    probes.append(Probe())
    rates, costs = MedianProbe(probes)
    cal_costs, cal_rates = planner.Calibrated(costs, rates, cal)
    for c, (row, found) in zip(configs, measured):
        if found is not None:
            predicted = planner.PredictSeconds(c, costs, rates, batch)
            calibrated = planner.PredictSeconds(c, cal_costs, cal_rates, batch)
            _Measured(row, c.replicas, predicted, calibrated, *found)
    return dict(
        rows=[row for row, _ in measured],
        setup_s=setup_s,
        calibration=dataclasses.asdict(cal),
        rates=dataclasses.asdict(rates),
        probes=[_ProbeNote(r, c) for r, c in probes],
    )


# The device's rates and the cells' profile, taken at a child's start, after each
# PROBES-th of its rows and at its end; every row is predicted from their median. One
# probe taken in a slow spell of this shared VM (the MLP's 7.8e10 FLOP/s against 1.0e11
# in other runs) put a whole model's predictions off together.
PROBES = 3


def _ProbeDue(i: int, n: int) -> bool:
    """Whether a probe is taken before the i-th of n rows (at each PROBES-th, not the
    first: the start has its own)."""
    return i > 0 and any(i == n * k // PROBES for k in range(1, PROBES))


def MedianProbe(probes: list) -> tuple:
    """(rates, costs): each rate, and each profiled time of each cell, the median over the
    probes' (rates, planner.ModelCosts)."""
    import dataclasses

    rates = [r for r, _ in probes]
    median = dataclasses.replace(
        rates[0],
        **{f.name: statistics.median(getattr(r, f.name) for r in rates)
           for f in dataclasses.fields(rates[0])},
    )  # fmt: skip
    times = [c.times for _, c in probes]
    if times[0] is None:
        return median, probes[0][1]

    def Lines(field: str) -> tuple:
        found = [getattr(t, field) for t in times]
        # 'backward' (both gradients at once) is there where it profiled faster: the
        # probes' most common answer.
        size = statistics.mode(len(lines) for lines in found)
        found = [lines for lines in found if len(lines) == size]
        return tuple(
            tuple(statistics.median(lines[i][j] for lines in found) for j in range(2))
            for i in range(size)
        )

    fields = [f.name for f in dataclasses.fields(times[0]) if f.name != "source"]
    profiled = dataclasses.replace(times[0], **{f: Lines(f) for f in fields})
    return median, dataclasses.replace(probes[0][1], times=profiled)


def _ProbeNote(rates, costs) -> dict:
    """What plan.json keeps of one probe: its FLOP rate, fixed cost per action and the
    whole forward's profiled seconds per example."""
    note = dict(flops_per_s=rates.flops_per_s, action_s=rates.action_s)
    if costs.times is not None:
        note["forward_s_per_example"] = sum(b for _, b in costs.times.forward)
    return note


def Row(model, pipe_p, inputs, loss_fn, c, batch, steps, traced) -> tuple[dict, tuple | None]:
    """(the row of candidate c, what _Measured needs beside the predictions: None where
    it failed) of one configuration measured: its steps' times, the allocator's peak,
    a profiled step's peak and tensors, and the estimate."""
    import tensorflow as tf

    gc.collect()
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    row = dict(
        model=model, R=c.replicas, K=c.num_stages, M=c.num_micro_batches, schedule=c.schedule
    )
    row.update(
        v=c.num_virtual_stages, remat=c.remat, partition=c.partition_policy, cells=list(c.partition)
    )
    row["actions"] = _Signature(c)
    try:
        per_device, host, alone = EstimateDevices(pipe_p, inputs, c, traced)
        step = BuildStep(pipe_p, inputs, loss_fn, c)[0]
        seconds, best, peak = Measure(step, steps)
        profiled = _Above(ProfiledPeak(step), before)
        del step
        tensors = TensorsPeak(lambda: BuildStep(pipe_p, inputs, loss_fn, c)[0])
    except Exception as e:  # noqa: BLE001 (a row of the table, not the end of the run)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return row, None
    row["load"] = round(os.getloadavg()[0], 2)
    return row, (seconds, best, per_device, host, peak - before, (profiled[0], tensors), alone)


def _Above(profiled: tuple[int, int], before: int) -> tuple[int, int]:
    """A profiled step's (peak, tensors) above `before`; (0, 0) where it recorded none."""
    return (profiled[0] - before, profiled[1] - before) if profiled[1] else (0, 0)


def _Measured(
    row, replicas, predicted, calibrated, seconds, best, per_device, host, used, tensors, alone=None
):
    """Fills a row's predictions (seconds; bytes per device of one pipeline and one
    allocator's total) against what was measured (median and least seconds; bytes
    used; a profiled step's peak above the same start, _Above; the tensors' peak,
    TensorsPeak), with their errors: memory_err against the allocator's peak,
    tensors_err against the most the tensors asked for (without the allocator's slack,
    allocations.Peaks). `alone`: see _MemoryColumns (None: `per_device`)."""
    row["predicted_s"], row["calibrated_s"] = predicted, calibrated
    row["measured_s"], row["measured_best_s"] = seconds, best
    row["measured_mib"] = used / 2**20
    for key in ("predicted_s", "calibrated_s"):
        row[key.replace("_s", "_err")] = row[key] / seconds - 1
        row[key.replace("_s", "_err_best")] = row[key] / best - 1
    if tensors[1]:
        row["profiled_mib"], row["tensors_mib"] = tensors[0] / 2**20, tensors[1] / 2**20
    _MemoryColumns(row, replicas, per_device, host, per_device if alone is None else alone)


def _MemoryColumns(row: dict, replicas: int, per_device: list, host: int, alone: list) -> None:
    """A row's memory estimate (bytes per device of replica 0's pipeline, one allocator's
    total) and its errors against what the row measured. `alone`: per device of a
    pipeline that receives no other replica's gradients, as none are copied in one
    process (devices_sum_mib)."""
    row["peak_device_mib"] = [b / 2**20 for b in per_device]
    row["predicted_mib"] = replicas * host / 2**20
    row["devices_sum_mib"] = replicas * sum(alone) / 2**20
    row["memory_err"] = row["predicted_mib"] / row["measured_mib"] - 1
    if "tensors_mib" in row:
        row["tensors_err"] = row["predicted_mib"] / row["tensors_mib"] - 1


def Reestimate(rows: list) -> None:
    """The memory columns of the measured `rows` written again from the code as it is
    (each model's cells or layer calls traced here, nothing run), as the children
    estimate them; the measured columns kept."""
    common.Setup(2, intra_op=1, inter_op=2)
    from lingpipe.keras import graph as graph_lib
    from lingpipe.keras import graph_memory
    from lingpipe.pipeline.planning import planner

    models, traced = {}, {}
    for row in rows:
        if "error" in row or "measured_mib" not in row:
            continue
        c = planner.Candidate(
            row["R"], row["K"], row["M"], row["schedule"], row["v"], row["remat"],
            tuple(row["cells"]),
        )  # fmt: skip
        if row["model"] == "keras":
            if "keras" not in models:
                model, x, _ = KerasModel()
                graph = graph_lib.Trace(model, "bench")
                nodes = graph_memory.TraceNodes(graph, "bench")
                memory = graph_memory.GraphMemory(graph, nodes, 2, _AdamUpdate())
                models["keras"] = memory, x.shape[0]
            memory, batch = models["keras"]
            per_device, host = KerasEstimate(memory, c, batch)
            alone = per_device  # one replica: it receives no gradients
        else:
            if row["model"] not in models:
                models[row["model"]] = Model(row["model"])
                traced[row["model"]] = {}
            pipe_p, inputs, _ = models[row["model"]]
            per_device, host, alone = EstimateDevices(pipe_p, inputs, c, traced[row["model"]])
        _MemoryColumns(row, row["R"], per_device, host, alone)


def _AdamUpdate():
    """The update of the Adam the Keras rows train with (update_memory.UpdateCostOf)."""
    import keras

    from lingpipe.pipeline.observe import update_memory

    return update_memory.UpdateCostOf(keras.optimizers.Adam(1e-4))


def KerasModel(seed: int = 0):
    """A transformer text classifier written as keras.io's example writes it (token and
    position embedding, a Transformer block of MultiHeadAttention and a feed-forward,
    pooling, Dense), two blocks of 128 wide at 64 tokens: (model, x, y)."""
    import keras
    import numpy as np

    vocab, length, width, batch = 8000, 64, 128, 64

    class TokenAndPositionEmbedding(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.token_emb = keras.layers.Embedding(vocab, width)
            self.pos_emb = keras.layers.Embedding(length, width)

        def call(self, x):
            positions = keras.ops.arange(0, keras.ops.shape(x)[-1])
            return self.token_emb(x) + self.pos_emb(positions)

    class TransformerBlock(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.att = keras.layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)
            self.ffn = keras.Sequential(
                [keras.layers.Dense(4 * width, activation="relu"), keras.layers.Dense(width)]
            )
            self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6)
            self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6)

        def call(self, x):
            x = self.norm1(x + self.att(x, x))
            return self.norm2(x + self.ffn(x))

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((length,), dtype="int32")
    h = TokenAndPositionEmbedding()(inputs)
    for _ in range(2):
        h = TransformerBlock()(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    h = keras.layers.Dense(64, activation="relu")(h)
    outputs = keras.layers.Dense(2)(h)
    model = keras.Model(inputs, outputs, name="transformer_classifier")
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, (batch, length)).astype("int32")
    y = rng.integers(0, 2, (batch,)).astype("int32")
    return model, x, y


def KerasChild(cfg: dict, steps: int, threads: str = "intra1_inter2", builds: int = 2) -> dict:
    """The Keras rows: lingpipe.keras.Plan's predictions (its costs: each layer call
    profiled here, keras_plan.PlanCosts; the graph's memory estimate) against
    lingpipe.keras.Pipeline trained with Adam. The Keras pipeline has one replica: K=1
    is the model on one device."""
    _Setup(threads)
    import dataclasses

    import keras
    import tensorflow as tf

    import lingpipe.keras as lpk
    from lingpipe.keras import graph as graph_lib
    from lingpipe.keras import graph_memory
    from lingpipe.keras import plan as keras_plan
    from lingpipe.pipeline.planning import planner

    model, x, y = KerasModel()
    batch = x.shape[0]
    graph = graph_lib.Trace(model, "bench")
    memory = graph_memory.GraphMemory(
        graph, graph_memory.TraceNodes(graph, "bench"), 2, _AdamUpdate()
    )
    grid_cfg = {k: tuple(v for v in KERAS[k] if v in cfg[k]) for k in ("micro_batches", "remats")}
    names = [n for n in KERAS["schedules"] if cfg["schedules"] is None or
             n in [s for s, _ in cfg["schedules"]]]  # fmt: skip
    schedules = tuple(s for s in planner.SCHEDULES if s[0] in names)
    grid = []
    for k, scheds in ((1, (("gpipe", 1),)), (2, schedules)):
        grid += planner.Candidates(
            k, len(graph.nodes), batch, scheds, grid_cfg["remats"], grid_cfg["micro_batches"],
            stages=(k,),
        )  # fmt: skip

    def Probe():
        costs, note = keras_plan.PlanCosts(graph, grid, batch, 2**40, "auto", DEVICES[0])
        return planner.MeasureRates(DEVICES[0]), costs, note

    start = time.perf_counter()
    rates, costs, costs_note = Probe()
    probes = [(rates, costs)]
    setup_s = time.perf_counter() - start
    configs, measured, steps_of = [], [], []
    for base in grid:
        chunks = base.num_stages * (
            2 if base.schedule in ("zbv", "v_half", "v_min") else base.num_virtual_stages
        )
        policy, counts = planner.Partitions(costs, chunks)[0]
        configs.append(dataclasses.replace(base, partition=counts, partition_policy=policy))
    for i, c in enumerate(configs):
        if _ProbeDue(i, len(configs)):
            probes.append(Probe()[:2])
        row = dict(model="keras", R=1, K=c.num_stages, M=c.num_micro_batches, schedule=c.schedule)
        row.update(
            v=c.num_virtual_stages, remat=c.remat, partition=c.partition_policy,
            cells=list(c.partition),
        )  # fmt: skip
        row["actions"] = _Signature(c)
        gc.collect()
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        try:
            per_device, host = KerasEstimate(memory, c, batch)

            def Build(c=c):
                fresh, _, _ = KerasModel()
                piped = lpk.Pipeline(fresh, devices=list(DEVICES[: c.num_stages]), **c.Settings())
                piped.compile(
                    optimizer=keras.optimizers.Adam(1e-4),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                )
                return lambda p=piped: _Loss(p.train_on_batch(x, y))

            step = Build()
            seconds, best, peak = Measure(step, steps)
            profiled = _Above(ProfiledPeak(step), before)
            del step
            tensors = TensorsPeak(Build)
        except Exception as e:  # noqa: BLE001 (a row of the table, not the end of the run)
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            measured.append((row, None))
            steps_of.append(None)
            continue
        row["load"] = round(os.getloadavg()[0], 2)
        found = (seconds, best, per_device, host, peak - before, (profiled[0], tensors))
        measured.append((row, found))
        steps_of.append(Build)
        print(json.dumps(row), file=sys.stderr, flush=True)
    SecondBuilds(measured, steps_of, steps, builds)
    probes.append(Probe()[:2])
    rates, costs = MedianProbe(probes)
    flop_costs = keras_plan.ModelCosts(graph)
    for c, (row, found) in zip(configs, measured):
        if found is None:
            continue
        predicted = planner.PredictSeconds(c, costs, rates, batch)
        _Measured(row, 1, predicted, predicted, *found)
        # The same step predicted from FLOPs at the measured rate, beside the profile.
        row["flops_s"] = planner.PredictSeconds(c, flop_costs, rates, batch)
        row["flops_err"] = row["flops_s"] / found[0] - 1
    return dict(
        rows=[row for row, _ in measured],
        rates=dataclasses.asdict(rates),
        costs=costs_note,
        setup_s=setup_s,
        probes=[_ProbeNote(r, c) for r, c in probes],
    )


class _Loss:
    """train_on_batch's result as Measure reads a step's (its .numpy())."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


def PlanHundred() -> dict:
    """Seconds for planner.Search over a 100-cell MLP on 2 devices (memory estimated per
    candidate, FLOPs at the measured rate), rates measured first (not counted)."""
    common.Setup(2)
    import tensorflow as tf

    from lingpipe.layers import gpipe, linear
    from lingpipe.pipeline.planning import costs as costs_lib
    from lingpipe.pipeline.planning import planner

    cell = linear.ProjectionLayer.Params().Set(input_dims=512, output_dims=512, activation="RELU")
    pipe_p = gpipe.PipeliningLayer.Params().Set(
        name="pipe", cell_tpl=[cell.Copy() for _ in range(100)], input_shapes=[[512, 512]]
    )
    rates = planner.MeasureRates()
    start = time.perf_counter()
    metas = costs_lib.CellMetas(pipe_p, pipe_p.cell_tpl, ([512, 512],))
    costs = planner.ModelCosts(
        tuple(float(m.flops) / 512 for m in metas),
        tuple(costs_lib.ShapeBytes(m.out_shapes) // 512 for m in metas),
        tuple(4 * int(m.num_params) for m in metas),
        weight_counts=costs_lib.WeightCounts(pipe_p, pipe_p.cell_tpl),
    )
    traced: dict = {}
    inputs = (tf.zeros([512, 512]),)
    result = planner.Search(
        costs, rates, 2, 2**31, 512, lambda c: EstimateDevices(pipe_p, inputs, c, traced)[0]
    )
    return dict(
        seconds=time.perf_counter() - start,
        searched=result.searched,
        chosen=result.chosen.Describe(),
    )


def Noise(rows: list) -> dict:
    """How much the same step measures differently in one run: over pairs of rows of
    one model with the same work (_Signature), |a / b - 1| of their measured times
    (median and least of the steps) and memory. The floor under any prediction's error
    here."""
    ok = [r for r in rows if "error" not in r and "actions" in r]
    pairs = []
    for i, a in enumerate(ok):
        for b in ok[i + 1 :]:
            if (a["model"], a["actions"]) == (b["model"], b["actions"]):
                pairs.append((a, b))
    out: dict = dict(pairs=len(pairs))
    for key in ("measured_s", "measured_best_s", "measured_mib"):
        diffs = sorted(abs(a[key] / b[key] - 1) for a, b in pairs)
        if diffs:
            out[key] = dict(median=statistics.median(diffs), worst=diffs[-1])
    return out


def _Key(r: dict) -> tuple:
    return tuple(r[k] for k in ("model", "R", "K", "M", "schedule", "v", "remat")) + (
        tuple(r["cells"]),
    )


def Repeat(rows: list, previous: dict, source: str) -> list:
    """How much the same configuration measures differently in two runs: per model, over
    the rows of `previous` (an earlier plan.json) with the same configuration,
    |now / then - 1| of the measured time (median of the steps), the allocator's peak
    and the tensors' peak."""
    then = {_Key(r): r for r in previous.get("rows", []) if "error" not in r}
    out = []
    for model in sorted({r["model"] for r in rows if "error" not in r}):
        pairs = [(r, then[_Key(r)]) for r in rows
                 if "error" not in r and r["model"] == model and _Key(r) in then]  # fmt: skip
        if not pairs:
            continue
        row = dict(model=model, rows=len(pairs), against=source)
        for key, name in (
            ("measured_s", "step"), ("measured_mib", "memory"), ("tensors_mib", "tensors"),
        ):  # fmt: skip
            diffs = sorted(abs(a[key] / b[key] - 1) for a, b in pairs if key in a and key in b)
            if diffs:
                row[f"{name}_median"], row[f"{name}_worst"] = statistics.median(diffs), diffs[-1]
        out.append(row)
    return out


def SummaryRows(rows: list) -> list:
    """The issue's targets as a table: per model and over all rows, median and worst
    |error| of the step time (predicted, calibrated; against the median and the least
    of the steps) and of memory, its most negative error, and the noise floor (Noise)."""
    out = []
    models = sorted({r["model"] for r in rows if "error" not in r})
    for scope in models + ["all"]:
        mine = [r for r in rows if scope in ("all", r["model"])]
        s, noise = Summary(mine), Noise(mine)
        if "predicted_err" not in s:
            continue
        row = dict(scope=scope, rows=s["predicted_err"]["n"])
        for key, name in (
            ("predicted_err", "step"),
            ("calibrated_err", "step_calibrated"),
            ("predicted_err_best", "step_vs_least"),
            ("flops_err", "step_flops"),
            ("memory_err", "memory"),
            ("tensors_err", "tensors"),
        ):
            if key in s:
                row[f"{name}_median"] = s[key]["median"]
                row[f"{name}_worst"] = s[key]["worst"]
        row["memory_most_below"] = s["memory_err"]["most_below"]
        if "tensors_err" in s:
            row["tensors_most_below"] = s["tensors_err"]["most_below"]
        if "measured_s" in noise:
            row["noise_median"] = noise["measured_s"]["median"]
            row["noise_worst"] = noise["measured_s"]["worst"]
            row["noise_pairs"] = noise["pairs"]
        out.append(row)
    return out


def Summary(rows: list) -> dict:
    """Median and worst |error| of each prediction; memory also its most negative error
    (the issue: never more than 10% below measured)."""
    ok = [r for r in rows if "error" not in r]
    out = {}
    keys = (
        "predicted_err", "calibrated_err", "predicted_err_best", "calibrated_err_best",
        "flops_err",
    )  # fmt: skip
    for key in keys + ("memory_err", "tensors_err"):
        errs = sorted(abs(r[key]) for r in ok if key in r)
        if errs:
            out[key] = dict(median=statistics.median(errs), worst=errs[-1], n=len(errs))
    for key in ("memory_err", "tensors_err"):
        if key in out:
            out[key]["most_below"] = min(r[key] for r in ok if key in r)
    if ok:
        loads = [r["load"] for r in ok if "load" in r]
        if loads:
            out["load"] = dict(min=min(loads), median=statistics.median(loads), max=max(loads))
    return out


def ErrorsBy(rows: list) -> list:
    """Median signed error (predicted / measured - 1) per model and per schedule, M,
    remat and R x K: where the predictions miss."""
    ok = [r for r in rows if "error" not in r]
    out = []
    for model in sorted({r["model"] for r in ok}):
        mine = [r for r in ok if r["model"] == model]
        for group in ("schedule", "M", "remat", "RK"):
            for value in sorted({_Group(r, group) for r in mine}, key=str):
                some = [r for r in mine if _Group(r, group) == value]
                out.append(
                    dict(
                        model=model,
                        by=group,
                        value=str(value),
                        n=len(some),
                        predicted=statistics.median(r["predicted_err"] for r in some),
                        calibrated=statistics.median(r["calibrated_err"] for r in some),
                        memory=statistics.median(r["memory_err"] for r in some),
                    )
                )
    return out


def _Group(r: dict, group: str):
    return f"R={r['R']} K={r['K']}" if group == "RK" else r[group]


def Picks(rows: list) -> list:
    """Per model and two caps (the 25% and 75% quantiles of the rows' largest device
    estimate): the planner's pick by the calibrated prediction among the rows whose
    estimate fits, against the best measured of those rows; the pick's measured total
    memory (one allocator for both devices) and the estimate's error on it."""
    picks = []
    for model in sorted({r["model"] for r in rows}):
        ok = [r for r in rows if r["model"] == model and "error" not in r]
        peaks = sorted(max(r["peak_device_mib"]) for r in ok)
        if not peaks:
            continue
        for q in (0.25, 0.75):
            cap = peaks[int(q * (len(peaks) - 1))]
            fits = [r for r in ok if max(r["peak_device_mib"]) <= cap]
            pick = min(fits, key=lambda r: r["calibrated_s"])
            best = min(fits, key=lambda r: r["measured_s"])
            picks.append(
                dict(
                    model=model,
                    cap_mib=cap,
                    pick=_Name(pick),
                    best=_Name(best),
                    pick_measured_s=pick["measured_s"],
                    best_measured_s=best["measured_s"],
                    pick_vs_best=pick["measured_s"] / best["measured_s"] - 1,
                    # The two devices share one allocator here: its total, and the
                    # estimate's error on that total (the per-device figures that the
                    # cap bounds come from the same estimate).
                    pick_measured_mib=pick["measured_mib"],
                    pick_memory_err=pick["memory_err"],
                )
            )
    return picks


def _Name(r: dict) -> str:
    v = f" v={r['v']}" if r["v"] > 1 else ""
    return f"R={r['R']} K={r['K']} M={r['M']} {r['schedule']}{v} {r['remat']} {r['partition']}"


def Partition(rows: list) -> list:
    """The 32k LM under 1F1B: 'flops' against 'uniform', per (M, remat)."""
    out = []
    lm = [r for r in rows if r["model"] == "lm32k" and r["schedule"] == "1f1b" and "error" not in r]
    for r in lm:
        if r["partition"] != "flops":
            continue
        twin = [
            u
            for u in lm
            if u["partition"] == "uniform" and (u["M"], u["remat"]) == (r["M"], r["remat"])
        ]
        if twin:
            out.append(
                dict(
                    M=r["M"],
                    remat=r["remat"],
                    flops_cells=r["cells"],
                    uniform_cells=twin[0]["cells"],
                    flops_s=r["measured_s"],
                    uniform_s=twin[0]["measured_s"],
                    speedup=twin[0]["measured_s"] / r["measured_s"],
                )
            )
    return out


def _Config(args) -> dict:
    """The grid: QUICK or FULL, with what the flags narrow."""
    from lingpipe.pipeline.planning import planner

    cfg = dict(QUICK if args.quick else FULL)
    if args.models:
        cfg["models"] = tuple(args.models.split(","))
    if args.micro_batches:
        cfg["micro_batches"] = tuple(int(m) for m in args.micro_batches.split(","))
    if args.schedules:
        names = args.schedules.split(",")
        cfg["schedules"] = tuple(s for s in planner.SCHEDULES if s[0] in names)
    if args.remats:
        cfg["remats"] = tuple(args.remats.split(","))
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--quick", action="store_true", help="the MLP, M in {2, 4}, 3 schedules")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--builds",
        type=int,
        default=2,
        help="builds of each configuration, the second pass in reverse order; a row's "
        "time is its fastest build's (SecondBuilds)",
    )
    ap.add_argument(
        "--threads",
        choices=sorted(THREADS),
        default="intra1_inter2",
        help="one thread per device (intra-op 1, inter-op 2), or TensorFlow's default",
    )
    ap.add_argument("--models", default=None, help="comma-separated subset of lm32k,mlp,keras")
    ap.add_argument("--micro_batches", default=None, help="comma-separated M, e.g. 1,4,16")
    ap.add_argument("--schedules", default=None, help="comma-separated, e.g. 1f1b,zbv")
    ap.add_argument(
        "--remats", default=None, help="comma-separated subset of never,except_last,always"
    )
    ap.add_argument("--plan100", action="store_true")
    ap.add_argument("--out", default=None, help="default bench/results/plan.json (plan_quick.json)")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the rows of the models not measured now from the file already at --out",
    )
    ap.add_argument("--no_plan100", action="store_true", help="leave out the 100-cell plan")
    ap.add_argument(
        "--against",
        default=None,
        help="an earlier plan.json: how much the same configurations measure differently "
        "from run to run (its 'repeat' table); FILE or FILE=what it is",
    )
    ap.add_argument(
        "--rescore",
        action="store_true",
        help="measure nothing: the rows of --out, their tables made again (with --against)",
    )
    ap.add_argument(
        "--reestimate",
        action="store_true",
        help="with --rescore: the rows' memory estimates written again from the code first",
    )
    args = ap.parse_args(argv)
    if args.child:
        if args.plan100:
            result = PlanHundred()
        elif args.model == "keras":
            result = KerasChild(_Config(args), args.steps, args.threads, args.builds)
        else:
            result = Child(args.model, _Config(args), args.steps, args.threads, args.builds)
        print(json.dumps(result))
        return 0
    cfg = _Config(args)
    out = args.out or os.path.join(RESULTS, "plan_quick.json" if args.quick else "plan.json")
    rows, runs, kept = [], {}, None
    if args.rescore:
        with open(out, encoding="utf-8") as f:
            kept = json.load(f)
        if args.reestimate:
            Reestimate(kept["rows"])
            dates = sorted({v.get("date", kept["date"]) for v in kept["runs"].values()})
            kept["reestimated"] = (
                f"memory columns written again by --rescore --reestimate on "
                f"{datetime.date.today().isoformat()}; measured on {', '.join(dates)}"
            )
        return _Write(out, kept, kept["rows"], _Against(args.against) or kept.get("repeat"))
    if args.merge and os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            kept = json.load(f)
        if kept.get("threads", "intra1_inter2") != args.threads:
            print(
                f"--merge --threads={args.threads}: {out} was measured with threads="
                f"{kept.get('threads')}; rows of both cannot share one table",
                file=sys.stderr,
            )
            return 2
        rows = [r for r in kept["rows"] if r["model"] not in cfg["models"]]
        runs = {m: dict({"date": kept["date"]}, **v) for m, v in kept["runs"].items()
                if m not in cfg["models"]}  # fmt: skip
    for model in cfg["models"]:
        flags = [f"--model={model}", f"--steps={args.steps}", f"--threads={args.threads}"]
        flags += [f"--builds={args.builds}"] + [
            f"--{k}={getattr(args, k)}"
            for k in ("micro_batches", "schedules", "remats")
            if getattr(args, k)
        ]
        flags += ["--quick"] if args.quick else []
        print(f"measuring {model} ...", flush=True)
        got = common.RunChild(__file__, flags, timeout=6 * 3600)
        if "error" in got:
            rows.append(dict(model=model, error=" ".join(got["error"])))
            continue
        rows += got.pop("rows")
        runs[model] = dict(got, date=datetime.date.today().isoformat())
    hundred = None
    if not args.quick and not args.no_plan100:
        hundred = common.RunChild(__file__, ["--plan100"], timeout=600)
    elif kept:
        hundred = kept.get("plan_100_cells")
    repeat = _Against(args.against)
    if repeat and kept:  # the kept rows are not measured again: no repeat of theirs
        repeat = ({"rows": [r for r in repeat[0]["rows"] if r["model"] in cfg["models"]]},
                  repeat[1])  # fmt: skip
    payload = dict(
        machine=common.Machine(),
        date=datetime.date.today().isoformat(),
        threads=args.threads,
        grid=dict(
            quick=args.quick,
            steps=args.steps,
            builds=args.builds,
            **{k: v for k, v in cfg.items() if k not in ("schedules", "models")},
            models=sorted({r["model"] for r in rows}),
            schedules=[s for s, _ in cfg["schedules"]] if cfg["schedules"] else "planner.SCHEDULES",
        ),
        rows=rows,
        runs=runs,
        measured_now=list(cfg["models"]) if kept else "all",
        plan_100_cells=hundred,
    )
    return _Write(out, payload, rows, repeat)


def _Against(spec: str | None):
    """(previous plan.json's payload, what it is) from --against FILE[=what], or None."""
    if not spec:
        return None
    path, _, what = spec.partition("=")
    with open(path, encoding="utf-8") as f:
        return json.load(f), what or path


def _Write(out: str, payload: dict, rows: list, repeat) -> int:
    """The tables made from `rows` into `payload`, printed and written to `out`."""
    now = payload.get("measured_now")
    if isinstance(now, list):  # --merge: say which rows this run measured
        dates = {m: v.get("date", payload["date"]) for m, v in payload.get("runs", {}).items()}
        kept = [f"{m} ({d})" for m, d in sorted(dates.items()) if m not in now]
        payload["notes"] = [
            f"Measured by this run ({payload['date']}): {', '.join(now)}; the rows of "
            f"{', '.join(kept) or 'no other model'} were kept from the file (--merge), "
            "measured on the date given."
        ]
        single = sorted({r["model"] for r in rows if "measured_s" in r and "builds_s" not in r})
        if single and payload["grid"].get("builds", 1) > 1:
            payload["notes"].append(
                f"Rows of {', '.join(single)} were measured in one build each (the run that "
                f"measured them predates --builds); the others in {payload['grid']['builds']}, "
                "each row's time the fastest build's."
            )
    payload.update(
        summary=Summary(rows), noise=Noise(rows), summary_rows=SummaryRows(rows),
        errors_by=ErrorsBy(rows), picks=Picks(rows), partition=Partition(rows),
    )  # fmt: skip
    if isinstance(repeat, tuple):
        payload["repeat"] = Repeat(rows, *repeat)
    elif repeat:
        payload["repeat"] = repeat  # --rescore without --against keeps the file's
    hundred = payload.get("plan_100_cells")
    columns = [
        "model",
        "R",
        "K",
        "M",
        "schedule",
        "remat",
        "partition",
        "predicted_s",
        "calibrated_s",
        "measured_s",
        "calibrated_err",
        "predicted_mib",
        "measured_mib",
        "memory_err",
        "error",
    ]
    print(common.Table(rows, columns))
    print("errors |predicted / measured - 1|:", json.dumps(payload["summary"]))
    print("the same step measured twice, |a / b - 1|:", json.dumps(payload["noise"]))
    for p in payload["picks"]:
        print(
            f"cap {p['cap_mib']:.1f} MiB ({p['model']}): pick {p['pick']} "
            f"({p['pick_vs_best']:+.0%} vs best {p['best']})"
        )
    if hundred:
        print(f"plan of a 100-cell MLP: {hundred.get('seconds', float('nan')):.1f} s")
    common.WriteJson(out, payload)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

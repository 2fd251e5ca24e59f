"""The measurements of bench/gpu.py, each run in a child process of its own.

Each function runs in a fresh process that gpu.py starts (`gpu.py --child
--part=NAME`). It sets its devices up first (logical GPUs with a memory limit, or
with --smoke logical CPU devices and no GPU), then prints one JSON line per result
as soon as it has it (budget.Emit), so that a child stopped at its time budget
keeps what it finished. An out-of-memory is a row ({"oom": ...}), not a crash.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import budget, capacity, common  # noqa: E402

MIB = 1024 * 1024
# Per mode: the Transformer of the memory, speed and precision sections (bench/common.py's
# "transformer", set in each child; a section's `model` changes some of its fields), each
# section's pipeline, the memory limit of each logical GPU (MiB), and the capacity
# table's size (bench/capacity.py's SIZES).
SIZES = {
    "gpu": dict(
        # A Transformer-big layer (12.6 M parameters) on 32 x 256 tokens.
        model=dict(cells=8, batch=32, time=256, dims=1024, heads=16, hidden=4096),
        memory=dict(stages=4, micro=8, remat="never", device_mib=4096),
        speed=dict(stages=4, micro=8, remat="never", device_mib=16384, steps=10),
        precision=dict(
            stages=2, micro=2, remat="never", device_mib=16384, steps=10, model=dict(cells=4)
        ),
        capacity="gpu_quick",
    ),
    # Seconds on 2 cores: what costs is building the graphs (cells x micro-batches), not
    # running them. Activations of 256 KiB and more: TensorFlow's CPU allocator counts
    # no smaller allocation in its peak.
    "smoke": dict(
        model=dict(cells=4, batch=8, time=16, dims=32, heads=2, hidden=64),
        memory=dict(stages=2, micro=2, remat="never", model=dict(time=64, dims=256, hidden=512)),
        speed=dict(stages=2, micro=2, remat="never", steps=3),
        precision=dict(stages=2, micro=1, remat="never", steps=3, model=dict(cells=2)),
        capacity="smoke",
    ),
}
MEMORY_SCHEDULES = ("gpipe", "1f1b", "zbv")
SPEED_SCHEDULES = ("gpipe", "1f1b", "zero_bubble", "zbv")


def Mode(smoke: bool) -> str:
    return "smoke" if smoke else "gpu"


def Model(mode: str, section: str) -> dict:
    """The Transformer of `section` in `mode`, as bench/common.py's MODELS hold it."""
    return dict(SIZES[mode]["model"], **SIZES[mode][section].get("model", {}))


def Setup(num_devices: int, smoke: bool, device_mib: int | None = None) -> list[str]:
    """`num_devices` logical devices, before TensorFlow initializes: GPUs of `device_mib`
    each (split from GPU 0), or with `smoke` CPUs (any GPU hidden). Their names."""
    import tensorflow as tf

    if smoke:
        tf.config.set_visible_devices([], "GPU")
        common.Setup(max(num_devices, 2))  # With one logical CPU device TF keeps no peak.
        return [f"/device:CPU:{i}" for i in range(num_devices)]
    gpu = tf.config.list_physical_devices("GPU")[0]
    limit = tf.config.LogicalDeviceConfiguration(memory_limit=device_mib)
    tf.config.set_logical_device_configuration(gpu, [limit] * num_devices)
    return [f"/device:GPU:{i}" for i in range(num_devices)]


def Machine(smoke: bool) -> None:
    """The device, TensorFlow's build (CUDA, cuDNN), and on a GPU its details and the time
    of a first training step (kernels compiled from PTX on first use land in CUDA's cache,
    which gpu.py enlarges, for the children after this one)."""
    import tensorflow as tf

    if smoke:
        tf.config.set_visible_devices([], "GPU")
    build = tf.sysconfig.get_build_info()
    info = common.Machine()
    info.update(
        cuda_build=build.get("cuda_version"),
        cudnn_build=build.get("cudnn_version"),
        cuda_compute_capabilities=build.get("cuda_compute_capabilities"),
        tensor_float_32=tf.config.experimental.tensor_float_32_execution_enabled(),
    )
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not smoke:
        tf.config.experimental.set_memory_growth(gpus[0], True)  # before TF initializes it
        details = tf.config.experimental.get_device_details(gpus[0])
        info["device"] = details.get("device_name", gpus[0].name)
        info["compute_capability"] = ".".join(map(str, details.get("compute_capability", ())))
        info.update(NvidiaSmi())
    else:
        cpu = platform.processor() or platform.machine()
        info["device"] = f"CPU ({cpu}, {os.cpu_count()} cores), logical CPU devices"
    budget.Emit("machine", **info)  # first: a first step stopped at the budget keeps it
    if gpus and not smoke:
        budget.Emit("first_step", seconds=_FirstStep())


def NvidiaSmi() -> dict:
    """The driver, the CUDA version it supports, and the GPU's memory, from nvidia-smi
    (empty where it is missing)."""
    if not shutil.which("nvidia-smi"):
        return {}
    query = ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]
    out = {}
    try:
        driver, total = (
            subprocess.run(query, capture_output=True, text=True, timeout=20)
            .stdout.splitlines()[0]
            .split(", ")
        )
        out.update(driver=driver, memory_total_mib=int(total.split()[0]))
        banner = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
        found = re.search(r"CUDA Version:\s*([\d.]+)", banner)
        out["cuda_driver"] = found.group(1) if found else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        out["nvidia_smi_error"] = budget.LastLine(str(e))
    return out


def _FirstStep() -> float:
    """Seconds of a first training step (trace, Adam, GPU kernels) of two small layers."""
    start = time.perf_counter()
    common.MODELS["transformer"] = dict(SIZES["smoke"]["model"], cells=2)
    layer = common.Build("transformer", 1, 2, "always")
    Train = common.AdamStep(layer)
    Train(*common.Inputs("transformer")).numpy()
    return time.perf_counter() - start


def Capacity(smoke: bool, parallel: int) -> None:
    """bench/capacity.py's rows. Every row's depth by the estimate first (its 'estimate'
    lines); on a GPU, each row's search (capacity.GpuRow: a process per probe, a real
    out-of-memory) starts from that depth, `parallel` rows at a time, and says each
    probe as it ends (its 'probe' lines). Without a GPU, the estimate's rows."""
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")  # the GPU is the probes'; this process uses none
    size = SIZES[Mode(smoke)]["capacity"]
    cfg = capacity.SIZES[size]
    rows = [(name, k, m or cfg["micro"], remat) for name, k, m, remat in capacity.ROWS]
    hints = [capacity.EstimateRow(cfg, *r) for r in rows]
    if smoke or not tf.config.list_physical_devices("GPU"):
        for hint in hints:
            budget.Emit("row", **hint, mode="estimate")
        return
    for hint in hints:
        budget.Emit("estimate", **hint)

    def Row(i: int) -> None:
        name, k, m, remat = rows[i]

        def Heard(layers: int, result: dict) -> None:
            budget.Emit("probe", row=name, layers=layers, **result)

        start = hints[i]["layers"] or None
        row = capacity.GpuRow(cfg, name, k, m, remat, size, start=start, on_probe=Heard)
        budget.Emit("row", **row, mode="gpu", estimate_layers=hints[i]["layers"])

    with futures.ThreadPoolExecutor(max(1, parallel)) as pool:
        # The deepest rows first: they take longest.
        list(pool.map(Row, reversed(range(len(rows)))))


def Memory(smoke: bool, schedule: str) -> None:
    """One schedule's training step (ForwardBackward, no optimizer): each device's peak
    against lingpipe.pipeline.observe.memory's estimate of that device; on CPU, where one
    allocator serves every logical device, the total against the estimate's total."""
    sizes = SIZES[Mode(smoke)]
    cfg = sizes["memory"]
    Setup(cfg["stages"], smoke, cfg.get("device_mib"))
    import tensorflow as tf

    from lingpipe.pipeline.observe import memory

    common.MODELS["transformer"] = Model(Mode(smoke), "memory")
    base = dict(schedule=schedule, stages=cfg["stages"], micro_batches=cfg["micro"])
    base["remat"] = cfg["remat"]
    layer = common.Build("transformer", cfg["stages"], cfg["micro"], cfg["remat"], schedule)
    inputs = common.Inputs("transformer")
    step = common.TrainStep(layer, executor=True)
    try:
        tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))  # trace, allocate
        memory.ResetPeaks(layer.devices)
        tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))
    except tf.errors.ResourceExhaustedError as e:
        budget.Emit("row", **base, oom=budget.LastLine(str(e)))
        return
    measured = memory.MeasuredPeaks(layer.devices)
    report = layer.PartitionReport(input_shapes=[x.shape for x in inputs])
    per_device = report.DeviceMemory()
    for device, peak in measured.items():
        estimate = per_device[device].total if device in per_device else report.memory_total
        budget.Emit(
            "row", **base, device=device.split("device:")[-1], measured_mib=peak / MIB,
            estimate_mib=estimate / MIB,
            est_over_measured=estimate / peak if peak else None,
        )  # fmt: skip


def Speed(smoke: bool, budget_s: float) -> None:
    """The plain stack against each schedule's pipelined training step over the logical
    devices, side by side in this process; beside each, the schedule's simulated bubble."""
    sizes = SIZES[Mode(smoke)]
    cfg = sizes["speed"]
    k, m = cfg["stages"], cfg["micro"]
    Setup(k, smoke, cfg.get("device_mib"))
    from lingpipe.pipeline.schedules import generators, simulate

    common.MODELS["transformer"] = Model(Mode(smoke), "speed")
    inputs = common.Inputs("transformer")
    steps, rows = {}, {}
    for name in ("plain",) + SPEED_SCHEDULES:
        plain = name == "plain"
        layer = common.Build("transformer", 0 if plain else k, m, cfg["remat"], name)
        steps[name] = (Synced(common.TrainStep(layer, executor=not plain)), inputs)
        rows[name] = dict(config=name, stages="plain" if plain else k)
        rows[name].update(micro_batches="-" if plain else m, remat="-" if plain else cfg["remat"])
        rows[name]["bubble"] = (
            0.0 if plain else simulate.Simulate(generators.Make(name, k, m)).bubble
        )

    def Report(ms: dict[str, float], rounds: dict[str, int]) -> None:
        for name in ms:
            vs_plain = ms[name] / ms["plain"] if "plain" in ms else None
            budget.Emit("row", **rows[name], ms=ms[name], vs_plain=vs_plain, rounds=rounds[name])

    TimeSideBySide(steps, cfg["steps"], budget_s, Report)


def Precision(smoke: bool, budget_s: float) -> None:
    """bfloat16 activations with XLA against float32, side by side in this process: the
    plain stack (jit_compile over its step) and a 1F1B pipeline (jit_compile_stages: each
    stage compiled for its device)."""
    sizes = SIZES[Mode(smoke)]
    cfg = sizes["precision"]
    k, m = cfg["stages"], cfg["micro"]
    Setup(k, smoke, cfg.get("device_mib"))
    import tensorflow as tf

    from lingpipe.layers import gpipe

    common.MODELS["transformer"] = Model(Mode(smoke), "precision")
    steps, rows = {}, {}
    for precision, xla in (("float32", False), ("bfloat16", True)):
        inputs = common.Inputs("transformer", precision)
        plain = common.TrainStep(common.Build("transformer", 0, 1, "never", dtype=precision))
        if xla:
            plain = tf.function(plain.python_function, autograph=False, jit_compile=True)
        pipe = (
            gpipe.PipeliningLayer.Params()
            .Set(name="pipe", cell_tpl=common.CellParams("transformer", precision))
            .Set(num_stages=k, num_micro_batches=m, remat=cfg["remat"], schedule="1f1b")
            .Set(jit_compile_stages=xla)
            .Instantiate()
        )
        for stages, step in (("plain", plain), (k, common.TrainStep(pipe, executor=True))):
            name = f"{'plain' if stages == 'plain' else '1f1b'} {precision}" + " XLA" * xla
            steps[name] = (Synced(step), inputs)
            rows[name] = dict(
                config=name, stages=stages, micro_batches=1 if stages == "plain" else m
            )
            rows[name].update(precision=precision, xla=xla)

    def Report(ms: dict[str, float], rounds: dict[str, int]) -> None:
        for name in ms:
            f32 = name.split()[0] + " float32"
            vs_f32 = ms[name] / ms[f32] if f32 in ms else None
            budget.Emit("row", **rows[name], ms=ms[name], vs_float32=vs_f32, rounds=rounds[name])

    TimeSideBySide(steps, cfg["steps"], budget_s, Report)


def Synced(step):
    """`step` (a training step: loss and gradients) as a tf.function that returns the
    loss and a sum over every gradient, each summed on its own device: reading the two
    waits for all of the step's work, on every device, and copies two numbers."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def Run(*inputs):
        loss, grads = step(*inputs)
        sums = []
        for g in tf.nest.flatten(grads):
            with tf.device(g.device):
                sums.append(tf.reduce_sum(tf.cast(g, tf.float32)))
        return loss, tf.add_n(sums)

    return Run


def TimeSideBySide(steps: dict, rounds: int, budget_s: float, report) -> None:
    """Times each (step, inputs) of `steps` in turns: a round runs every ready step once.
    Each step first runs twice untimed (their seconds: a 'setup' line), then one round
    of all the ready ones follows and `report({name: median ms}, {name: rounds})` hears
    the figures so far, so that a part stopped at its budget keeps them (the last row
    of a config is its figure); at the end, rounds until each has `rounds` of them.

    A step that runs out of memory is a row with its error ('oom'). One whose untimed
    runs would likely end past `budget_s` (counted from this process's start, at one
    and a half times the longest so far) is not run and says so ('skipped')."""
    import tensorflow as tf

    ready, times, longest = {}, {}, 0.0

    def Round() -> None:
        for name, (step, inputs) in ready.items():
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))
            times[name].append(time.perf_counter() - start)

    def Report() -> None:
        ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
        report(ms, {name: len(t) for name, t in times.items()})

    for name, (step, inputs) in steps.items():
        start = time.perf_counter()
        if _Elapsed() + 1.5 * longest > 0.9 * budget_s:
            budget.Emit("row", config=name, skipped="not run: the part's time budget was near")
            continue
        try:
            for _ in range(2):
                tf.nest.map_structure(lambda t: t.numpy(), step(*inputs))
        except tf.errors.ResourceExhaustedError as e:
            budget.Emit("row", config=name, oom=budget.LastLine(str(e)))
            continue
        longest = max(longest, time.perf_counter() - start)
        budget.Emit("setup", config=name, first_two_steps_s=time.perf_counter() - start)
        ready[name], times[name] = (step, inputs), []
        Round()
        Report()
    while ready and min(map(len, times.values())) < rounds:
        Round()
    Report()


def _Elapsed() -> float:
    """Seconds since this process started (its budget counts from the parent's start of it)."""
    return time.time() - _STARTED


_STARTED = time.time()

"""bench/gpu.py's planner part: lingpipe's plan on logical devices with a memory limit
each, its predictions against what its picks measure there, per device.

The child splits the device into DEVICES logical devices of the cap each (GPUs with
`memory_limit`; with --smoke CPU devices, one allocator), measures the device's rates
and plans the model as `python -m lingpipe.plan` does (lingpipe.plan.Plan: its cells
profiled on the first device, B together on the second). The search is restricted to
pipelines over every device (K = DEVICES), the plans whose per-device estimate a split
GPU can check; the unrestricted pick (replicas too) is printed beside them. Then it
builds the pick and the runners-up in turn, each as the trainer would (the task's
TrainStep with the plan's settings), and measures each one's step (median) and each
device's peak against the prediction. A plan that runs out of memory is a row.
"""

from __future__ import annotations

import gc
import time

from bench import budget

MIB = 1024 * 1024
# Per mode: the registered model and what changes in its params (task, input), the
# devices, each one's memory (the plan's cap and, on a GPU, the logical device's limit),
# where the costs come from (lingpipe.plan's --costs), how many plans are measured and
# the steps timed for each.
SIZES = {
    # Transformer-big layers (1024 wide, 4096 hidden, 16 heads), 4 of them, on
    # 32 x 256 bytes: a pipelined configuration builds in seconds, not minutes.
    "gpu": dict(
        model="lm.TransformerLmGPipe",
        task=dict(num_layers=4, max_len=256, num_stages=2, num_micro_batches=4),
        input=dict(batch_size=32, seq_len=256),
        devices=2,
        cap_mib=1536,
        costs="auto",
        top=4,
        steps=10,
    ),  # fmt: skip
    "smoke": dict(
        model="lm.TransformerLmTiny",
        task={},
        input={},
        devices=2,
        cap_mib=64,
        costs="flops",
        top=2,
        steps=3,
    ),  # fmt: skip
}


def Model(cfg: dict):
    """lingpipe.plan.RegisteredModel of `cfg`'s model with its changes."""
    from lingpipe import model_registry, plan

    p = model_registry.GetParams(cfg["model"], "Train")
    p.Set(**cfg["task"])
    p.input.Set(**cfg["input"])
    return plan.RegisteredModel(cfg["model"], None, params=p)


def Planner(smoke: bool, budget_s: float, setup) -> None:
    """The child (module doc). `setup(n, smoke, device_mib)`: gpu_parts.Setup."""
    start = time.monotonic()
    cfg = SIZES["smoke" if smoke else "gpu"]
    devices = setup(cfg["devices"], smoke, cfg["cap_mib"])
    from lingpipe import plan
    from lingpipe.pipeline.planning import planner

    model = Model(cfg)
    cap = cfg["cap_mib"] * MIB
    rates = planner.MeasureRates(devices[0])
    k = dict(stages=[len(devices)])
    result = plan.Plan(model, len(devices), cap, rates, restrict=k, costs=cfg["costs"])
    free = plan.Plan(model, len(devices), cap, rates, costs=result.costs)
    budget.Emit(
        "plan", model=cfg["model"], devices=len(devices), cap_mib=cfg["cap_mib"],
        global_batch=model.global_batch, costs=result.costs_note,
        searched=result.searched, refused=len(result.refused),
        pick=result.chosen.Describe(), unrestricted_pick=free.chosen.Describe(),
        unrestricted_ms=free.chosen.step_seconds * 1e3, plan_s=time.monotonic() - start,
    )  # fmt: skip
    ranked = [result.chosen, *result.runners_up][: cfg["top"]]
    for rank, c in enumerate(ranked):
        if time.monotonic() - start > budget_s:
            return
        for row in Measured(model, c, devices, cfg["steps"]):
            budget.Emit("row", rank=rank, **row)


def Measured(model, c, devices: list[str], steps: int) -> list[dict]:
    """One row per device of plan `c` trained `steps` steps after two untimed: the
    predicted and measured step (median), and the device's predicted and measured peak;
    on CPU one row (one allocator: the total against the estimates' sum)."""
    import tensorflow as tf

    from lingpipe import plan
    from lingpipe.pipeline.observe import memory

    base = dict(plan=c.Describe(), predicted_ms=c.step_seconds * 1e3)
    gc.collect()  # the last plan's step and tensors
    try:
        step, _ = model.TrainStep(c, model.global_batch)
        step().numpy()  # trace and allocate; MedianSeconds runs one more untimed
        memory.ResetPeaks(devices)
        measured = plan.MedianSeconds(step, steps)
        peaks = memory.MeasuredPeaks(devices)
    except tf.errors.ResourceExhaustedError as e:
        return [dict(base, oom=budget.LastLine(str(e)))]
    base.update(measured_ms=measured * 1e3, step_error=c.step_seconds / measured - 1)
    if len(peaks) == 1:  # one allocator
        ((where, peak),) = peaks.items()
        return [dict(base, device=where, **_Memory(sum(c.peak_bytes), peak))]
    return [
        dict(base, device=d.split("device:")[-1], **_Memory(c.peak_bytes[i], peaks[d]))
        for i, d in enumerate(devices)
    ]


def _Memory(estimate: int, peak: int) -> dict:
    return dict(
        predicted_mib=estimate / MIB, measured_mib=peak / MIB,
        est_over_measured=estimate / peak if peak else None,
    )  # fmt: skip

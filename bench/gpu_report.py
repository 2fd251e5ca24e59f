"""bench/gpu.py's results as markdown (bench/results/gpu.md), and the capacity rows
assembled from what the capacity part printed (finished rows, or bounds from its probes
when its budget ran out)."""

from __future__ import annotations

from typing import Any

from bench import budget

TITLES = {
    "capacity": "Capacity: the deepest Transformer stack that trains (GPipe, Table 1)",
    "memory": "Per-device peak memory of a pipelined training step against the estimate",
    "speed": "Step time: the plain stack against pipelined schedules",
    "precision": "Step time: bfloat16 + XLA against float32",
    "planner": "The planner: predicted against measured",
}
COLUMNS = {
    "capacity": ["row", "stages", "micro_batches", "remat", "layers", "layers_at_least",
                 "layers_below", "params_m", "vs_naive", "vs_naive_at_least", "peak_stage_mib",
                 "estimate_layers", "probe_errors"],
    "memory": ["schedule", "stages", "micro_batches", "remat", "device", "measured_mib",
               "estimate_mib", "est_over_measured", "oom"],
    "speed": ["config", "stages", "micro_batches", "remat", "bubble", "ms", "vs_plain", "oom",
              "skipped"],
    "precision": ["config", "stages", "micro_batches", "precision", "xla", "ms", "vs_float32",
                  "oom", "skipped"],
    "planner": ["rank", "plan", "device", "predicted_ms", "measured_ms", "step_error",
                "predicted_mib", "measured_mib", "est_over_measured", "oom"],
}  # fmt: skip


def CapacityRows(outcome: budget.Outcome, spec: list, cfg: dict) -> list[dict[str, Any]]:
    """One row per capacity.ROWS entry (`spec`) that has anything: the finished row, or
    for a search stopped at its budget the bounds its probes gave (layers_at_least fit,
    layers_below did not). vs_naive: parameters against the naive row's."""
    done = {r["row"]: r for r in outcome.Of("row")}
    estimates = {r["row"]: r for r in outcome.Of("estimate")}
    probes = outcome.Of("probe")
    known = [r for r in [*done.values(), *estimates.values()] if r.get("layers")]
    per_layer = known[0]["params_m"] / known[0]["layers"] if known else None
    rows = []
    for name, k, m, remat in spec:
        mine = [p for p in probes if p.get("row") == name]
        # A probe that crashed counts as too deep (capacity.GpuRow); say which did.
        crashed = [f"{p['layers']}: {' '.join(p['error'])}" for p in mine if p.get("error")]
        if name in done:
            rows.append(dict(done[name], **({"probe_errors": crashed} if crashed else {})))
            continue
        if not mine and name not in estimates:
            continue
        fit = max([p["layers"] for p in mine if p.get("fits")], default=0)
        row = dict(row=name, stages=k, micro_batches=m or cfg["micro"], remat=remat)
        row["layers_at_least"] = fit
        above = [p["layers"] for p in mine if not p.get("fits") and p["layers"] > fit]
        if above:
            row["layers_below"] = min(above)
        if per_layer and fit:
            row["params_m_at_least"] = fit * per_layer
        row["estimate_layers"] = estimates.get(name, {}).get("layers")
        row["search"] = "stopped at its time budget: bounds from the probes that ended"
        if crashed:
            row["probe_errors"] = crashed
        rows.append(row)
    naive = done.get(spec[0][0], {}).get("params_m")
    for r in rows:
        if naive and r.get("params_m"):
            r["vs_naive"] = r["params_m"] / naive
        elif naive and r.get("params_m_at_least"):
            r["vs_naive_at_least"] = r["params_m_at_least"] / naive
    return rows


def Markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# lingpipe on one GPU: bench/gpu.py",
        "",
        f"`{result['command']}`, {result['date']}: {result.get('wall_s', 0):.0f} s of a "
        f"{result['total_budget_s']} s budget.",
        "",
        f"- Device: {m.get('device')}" + (f", compute capability {m['compute_capability']}"
                                          if m.get("compute_capability") else ""),
        f"- TensorFlow {m.get('tf')} built with CUDA {m.get('cuda_build')}, cuDNN "
        f"{m.get('cudnn_build')}; float32 matmuls in TF32: {m.get('tensor_float_32')}",
    ]  # fmt: skip
    if m.get("driver"):
        lines.append(
            f"- Driver {m['driver']} (CUDA {m.get('cuda_driver')}), {m.get('memory_total_mib')} MiB"
        )
    if "first_step_s" in m:
        lines.append(
            f"- First training step (kernels compiled on first use): {m['first_step_s']:.1f} s"
        )
    if m.get("error"):
        lines.append(f"- The machine part ended early: {m['error']}")
    for name, section in result["sections"].items():
        lines += ["", f"## {TITLES[name]}", ""]
        lines += _SectionLines(name, section)
    return "\n".join(lines) + "\n"


def _SectionLines(name: str, section: dict[str, Any]) -> list[str]:
    out = []
    if section.get("note"):
        out += [section["note"] + ".", ""]
    if section.get("plan"):
        out += [_PlanLine(section["plan"]), ""]
    if "rows" in section:
        columns = [c for c in COLUMNS[name] if any(c in r for r in section["rows"])]
        out += _Table(section["rows"], columns)
    else:
        out.append(f"Skipped: {section['skipped']}.")
    if section.get("ratio_k8_vs_naive"):
        out += ["", f"K=8 against naive: {section['ratio_k8_vs_naive']:.1f}x "
                    f"(GPipe reports {section['gpipe_reports']})."]  # fmt: skip
    for error in section.get("errors", []):
        out.append(f"\nA part ended early: {error}.")
    spent = f"{section.get('seconds', 0):.0f} s"
    out.append(
        f"\n{spent} of {section['budget_s']:.0f} s." if section.get("budget_s") else f"\n{spent}."
    )
    return out


def _PlanLine(plan: dict[str, Any]) -> str:
    return (
        f"{plan['model']} on {plan['devices']} devices of {plan['cap_mib']} MiB, global batch "
        f"{plan['global_batch']}; costs: {plan['costs']}. {plan['searched']} plans searched, "
        f"{plan['refused']} refused; planned in {plan['plan_s']:.0f} s. Pick among pipelines "
        f"over every device: {plan['pick']}; unrestricted pick: {plan['unrestricted_pick']} "
        f"({plan['unrestricted_ms']:.3g} ms predicted)."
    )


def _Table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    head = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return head + ["| " + " | ".join(_Cell(r.get(c)) for c in columns) + " |" for r in rows]


def _Cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    if isinstance(v, list):
        return "; ".join(map(_Cell, v))
    return str(v).replace("|", "/")

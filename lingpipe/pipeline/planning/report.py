"""PartitionReport: per stage, its device, cells, parameters, FLOPs and boundary bytes.

One report for both front ends: a PipeliningLayer's stages of cells, and a Keras
graph's stages of layer calls (lingpipe.keras.graph), which also name the tensors
crossing each cut (a skip connection, a mask, a second input) below the table.

When the stages live on more than one host (devices of other tasks, as under
`--strategy=hosts`), the table gains a column with the bytes per step that cross
from a stage to the next stage's host (`CrossHostBytes`).

With input shapes, each stage also gets its estimated memory in a training step
(lingpipe.pipeline.observe.memory), printed as a second table; `measured` peaks, when
set, are printed beside it (per device, or one total where one allocator serves
every device, as on CPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from lingpipe.cluster import HostOf
from lingpipe.pipeline.observe import memory as memory_lib

__all__ = [
    "FLOPS_UNITS",
    "MIB",
    "Bytes",
    "PartitionReport",
    "PlanScreen",
    "StageReport",
]

MIB = 1024 * 1024
FLOPS_UNITS = {"GFLOPs": 1e9, "MFLOPs": 1e6}


@dataclasses.dataclass
class StageReport:
    stage: int
    device: str
    cells: list[str]
    num_params: int
    flops: int | None  # None when no input shapes are known
    boundary_bytes: int | None  # bytes this stage sends to the next, per micro-batch
    cost: float  # under the partition's own measure
    memory: memory_lib.StageMemory | None = None  # bytes; None without input shapes
    # (tensor name, shape (batch dim first), dtype) of each tensor sent to the next stage,
    # when the front end knows them (a Keras graph); boundary_bytes is their sum.
    crossing: list[tuple[str, tuple, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PartitionReport:
    """How a PipeliningLayer cut its cells (see `str(report)` for a table)."""

    policy: str
    num_micro_batches: int
    stages: list[StageReport]
    memory_note: str = ""  # what the memory estimate assumed, or why there is none
    measured: dict[str, int] | None = None  # {device: measured peak bytes}, MeasuredPeaks
    unit: str = "cells"  # what a stage is made of: 'cells', or a Keras graph's 'layer calls'
    flops_unit: str = "GFLOPs"  # the FLOPs column's unit (FLOPS_UNITS)
    amounts: str = ""  # what FLOPs and bytes count, when not a PipeliningLayer's own

    def AddMemory(self, estimate: Callable[[], list[memory_lib.StageMemory]], note: str) -> None:
        """Sets each stage's memory from `estimate()`; a ValueError (a cell that cannot be
        traced) leaves them None and says why in memory_note."""
        try:
            per_stage = estimate()
        except ValueError as e:
            self.memory_note = f"no memory estimate: {e}"
            return
        for s, m in zip(self.stages, per_stage):
            s.memory = m
        self.memory_note = note

    @property
    def memory_total(self) -> int | None:
        """Estimated bytes of all stages together; None without an estimate."""
        if any(s.memory is None for s in self.stages):
            return None
        return sum(s.memory.total for s in self.stages)

    def DeviceMemory(self) -> dict[str, memory_lib.StageMemory]:
        """{device: estimated memory of all the stages it runs} (memory.DeviceMemory);
        empty without an estimate."""
        if self.memory_total is None:
            return {}
        return {
            d: memory_lib.DeviceMemory([s.memory for s in self.stages if s.device == d])
            for d in dict.fromkeys(s.device for s in self.stages)
        }

    def CrossHostBytes(self) -> list[int | None]:
        """Per stage, the bytes per step that cross from it to the next stage's host:
        M micro-batches' boundary activations forward plus, of the same size, their
        gradients backward (0 when the next stage is on the same host or there is none;
        None when the boundary sizes are unknown)."""
        out: list[int | None] = []
        for s, after in zip(self.stages, self.stages[1:] + [None]):
            if after is None or HostOf(s.device) == HostOf(after.device):
                out.append(0)
            elif s.boundary_bytes is None:
                out.append(None)
            else:
                out.append(2 * s.boundary_bytes * self.num_micro_batches)
        return out

    @property
    def num_hosts(self) -> int:
        return len({HostOf(s.device) for s in self.stages})

    @property
    def imbalance(self) -> float:
        """Most expensive stage / mean stage cost (1.0 is perfect balance)."""
        costs = [s.cost for s in self.stages]
        mean = sum(costs) / len(costs)
        return max(costs) / mean if mean > 0 else 1.0

    def __str__(self) -> str:
        rows = [("stage", "device", self.unit, "params", self.flops_unit, "boundary KiB", "cost")]
        scale = FLOPS_UNITS[self.flops_unit]
        hosts = self.num_hosts > 1
        if hosts:
            rows[0] += ("to next host KiB/step",)
        crossing = self.CrossHostBytes()
        for s, cross in zip(self.stages, crossing):
            span = s.cells[0] if len(s.cells) == 1 else f"{s.cells[0]}..{s.cells[-1]}"
            cells = f"{span} ({len(s.cells)})"
            flops = "?" if s.flops is None else f"{s.flops / scale:.4f}"
            kib = "?" if s.boundary_bytes is None else f"{s.boundary_bytes / 1024:.1f}"
            row = (str(s.stage), s.device, cells, f"{s.num_params:,}", flops, kib, f"{s.cost:.4g}")
            if hosts:
                row += ("?" if cross is None else "" if not cross else f"{cross / 1024:.1f}",)
            rows.append(row)
        lines = _Table(rows)
        lines.append(
            f"partition={self.policy} micro_batches={self.num_micro_batches} "
            f"imbalance={self.imbalance:.3f} (max stage cost / mean)"
        )
        if hosts:
            total = "?" if None in crossing else f"{sum(crossing) / 1024:.1f} KiB"
            lines.append(
                f"{self.num_hosts} hosts: {total} cross between hosts per step (each "
                "micro-batch's boundary activations forward, their gradients backward)"
            )
        if self.amounts:
            lines.append(self.amounts)
        return "\n".join(lines + self._CrossingLines() + self._MemoryLines())

    def _CrossingLines(self) -> list[str]:
        """Per cut with named tensors: what crosses it, and their bytes."""
        lines = []
        for s in self.stages:
            if s.crossing:
                what = ", ".join(f"{n} {_Shape(sh)} {dt}" for n, sh, dt in s.crossing)
                lines.append(
                    f"stage {s.stage} -> stage {s.stage + 1}: {len(s.crossing)} tensor(s), "
                    f"{s.boundary_bytes:,} bytes: {what}"
                )
        return lines

    def _MemoryLines(self) -> list[str]:
        """The memory table (MiB), with measured peaks beside the estimate when known."""
        if self.memory_total is None:
            return [self.memory_note] if self.memory_note else []
        devices = {s.device for s in self.stages}
        per_device = self.measured is not None and set(self.measured) <= devices
        rows = [["stage", "weights", "grads", "slots", "activations", "workspace", "update"]]
        rows[0] += ["total"]
        rows[0] += ["alive"] + (["measured"] if per_device else [])
        for s in self.stages:
            m = s.memory
            parts = (m.weights, m.gradients, m.optimizer_slots, m.activations, m.workspace)
            parts += (m.update,)
            row = [str(s.stage)] + [_Mib(b) for b in parts + (m.total,)] + [str(m.peak_alive)]
            if per_device:
                row.append(_Mib(self.measured[s.device]) if s.device in self.measured else "?")
            rows.append(row)
        lines = [f"memory per stage in a training step, MiB ({self.memory_note}):", *_Table(rows)]
        if len(devices) < len(self.stages):  # a device runs several stages
            lines.append("per device (all its stages; activations at their joint peak):")
            for d, m in self.DeviceMemory().items():
                stages = ", ".join(str(s.stage) for s in self.stages if s.device == d)
                lines.append(f"  {d} (stages {stages}): {_Mib(m.total)} MiB, alive {m.peak_alive}")
        total = f"estimated total {_Mib(self.memory_total)} MiB"
        if self.measured and not per_device:
            (where, peak), *_ = self.measured.items()
            total += f"; measured peak {_Mib(peak)} MiB ({where}), estimate / measured "
            total += f"{self.memory_total / peak:.2f}"
        return lines + [total]


def _Table(rows: list) -> list[str]:
    """`rows` (lists of strings, the header first) as lines of left-aligned columns."""
    widths = [max(map(len, column)) for column in zip(*rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _Shape(shape: tuple) -> str:
    """'[batch, None, 64]': the batch dim, then the other dims (None where unknown)."""
    return "[" + ", ".join(["batch"] + [str(d) for d in shape[1:]]) + "]"


def _Mib(num_bytes: int) -> str:
    return f"{num_bytes / MIB:.1f}"


def Bytes(num_bytes: float) -> str:
    """Bytes in GiB, MiB or KiB, whichever reads best ('6.9 KiB', '1,024.0 MiB')."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if num_bytes >= size:
            return f"{num_bytes / size:,.1f} {unit}"
    return f"{num_bytes / 2**10:,.1f} KiB"


def PlanScreen(
    title: str,
    chosen: Any,
    what: str,
    how: str,
    runners_up: Sequence[Any],
    refused: Sequence[Any],
    ms_digits: int = 1,
    notes: Sequence[str] = (),
) -> str:
    """The planner's one screen, for `python -m lingpipe.plan` and lingpipe.keras.Plan:
    the chosen plan (`what` it is, `how` to run it), its predicted step time and peak per
    device, `notes`, the runners-up, and the first refused candidates with their excess."""
    lines = [
        title,
        f"  {chosen.Describe()}  [{what}]",
        f"  predicted {chosen.step_seconds * 1e3:.{ms_digits}f} ms per step, peak per device "
        + ", ".join(Bytes(b) for b in chosen.peak_bytes),
        f"  {how}",
        *notes,
        "runners-up:",
    ]
    for r in runners_up:
        lines.append(f"  {r.step_seconds * 1e3:8.{ms_digits}f} ms  {r.Describe()}")
    if not refused:
        return "\n".join(lines + ["refused: none, every candidate fits the cap"])
    lines.append(f"refused ({len(refused)}, over the cap):")
    for r in refused[:5]:
        over = Bytes(r.excess_bytes)
        lines.append(f"  device {r.device} over by {over}  {r.candidate.Describe()}")
    return "\n".join(lines)

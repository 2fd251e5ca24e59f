"""PartitionReport: per stage, its device, cells, parameters, FLOPs and boundary bytes."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class StageReport:
    stage: int
    device: str
    cells: list[str]
    num_params: int
    flops: int | None  # None when no input shapes are known
    boundary_bytes: int | None  # bytes this stage sends to the next, per micro-batch
    cost: float  # under the partition's own measure


@dataclasses.dataclass
class PartitionReport:
    """How a PipeliningLayer cut its cells (see `str(report)` for a table)."""

    policy: str
    num_micro_batches: int
    stages: list[StageReport]

    @property
    def imbalance(self) -> float:
        """Most expensive stage / mean stage cost (1.0 is perfect balance)."""
        costs = [s.cost for s in self.stages]
        mean = sum(costs) / len(costs)
        return max(costs) / mean if mean > 0 else 1.0

    def __str__(self) -> str:
        rows = [("stage", "device", "cells", "params", "GFLOPs", "boundary KiB", "cost")]
        for s in self.stages:
            span = s.cells[0] if len(s.cells) == 1 else f"{s.cells[0]}..{s.cells[-1]}"
            rows.append(
                (
                    str(s.stage),
                    s.device,
                    f"{span} ({len(s.cells)})",
                    f"{s.num_params:,}",
                    "?" if s.flops is None else f"{s.flops / 1e9:.4f}",
                    "?" if s.boundary_bytes is None else f"{s.boundary_bytes / 1024:.1f}",
                    f"{s.cost:.4g}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(
            f"partition={self.policy} micro_batches={self.num_micro_batches} "
            f"imbalance={self.imbalance:.3f} (max stage cost / mean)"
        )
        return "\n".join(lines)

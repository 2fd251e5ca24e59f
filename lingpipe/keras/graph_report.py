"""The partition report of a cut Keras graph: lingpipe.pipeline.planning.report's PartitionReport,
whose stages are layer calls and whose cuts name the tensors crossing them.

    print(graph_report.Report(cut, stage_devices, num_micro_batches=4, batch_size=64))
"""

from __future__ import annotations

from collections.abc import Sequence

from lingpipe.keras import graph as graph_lib
from lingpipe.pipeline.planning import report as report_lib

__all__ = [
    "Report",
]


def Report(
    cut: graph_lib.Cut,
    devices: Sequence[str],
    num_micro_batches: int = 1,
    batch_size: int | None = None,
) -> report_lib.PartitionReport:
    """Per stage: its device (`devices`, one per stage), layer calls, weights (a shared
    layer's where first used), FLOPs, the tensors crossing to the next stage and their
    bytes, and the stage's cost under the cut's policy. FLOPs and bytes are per example,
    or for `batch_size` examples."""
    graph, scale, stages = cut.graph, batch_size or 1, []
    params = graph_lib.FirstUseParams(graph)
    for s, idx in enumerate(cut.stages):
        sent = cut.live[s + 1] if s + 1 < len(cut.stages) else []
        crossing = [
            (graph_lib.TensorName(graph, k), graph.shapes[k], graph.dtypes[k]) for k in sent
        ]
        stages.append(
            report_lib.StageReport(
                stage=s,
                device=devices[s],
                cells=[graph.nodes[i].name for i in idx],
                num_params=sum(params[i] for i in idx),
                flops=scale * sum(graph_lib.NodeFlops(graph.nodes[i]) for i in idx),
                boundary_bytes=scale * sum(graph_lib.TensorBytes(graph, k) for k in sent),
                cost=sum(cut.costs[i] for i in idx),
                crossing=crossing,
            )
        )
    amounts = f"for batch {batch_size}" if batch_size else "per example"
    return report_lib.PartitionReport(
        cut.policy,
        num_micro_batches,
        stages,
        unit="layer calls",
        flops_unit="MFLOPs",
        amounts=f"FLOPs and bytes {amounts}",
    )

"""What an allocator held at its peak, and what the tensors in it asked for, from a profile.

TensorFlow's BFC allocator (every GPU's, and the CPU's where TF_CPU_ALLOCATOR_USE_BFC is
set, as lingpipe.cluster sets it) serves a request from a free chunk of memory and splits
the chunk only when it is at least twice the request: a request of 32 MiB served from a
free chunk of 56 MiB holds all 56 until it is freed. `get_memory_info(...)["peak"]`
counts chunks, so a step's measured peak includes this slack, which depends on what was
freed where before; the same step measured twice on this machine peaked at 134 and
150 MiB. The memory estimate (lingpipe.pipeline.observe.memory) counts tensors, what the
step asks for.

The profiler (tf.profiler.experimental, host tracer) records each allocation with the
bytes requested and the chunk that served them. `Peaks` reads them:

    tf.profiler.experimental.start(logdir)
    step()
    tf.profiler.experimental.stop()
    peaks = allocations.Peaks(timeline.ReadXSpace(timeline.LatestProfile(logdir)))
    peaks["bfc_cpu_allocator_for_gpu"].requested_bytes

Memory allocated before the profile started (the weights, the optimizer's slots) is
counted as its chunks: its requests are not in the profile.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["AllocatorPeak", "Peaks"]

_ALLOC, _FREE = "MemoryAllocation", "MemoryDeallocation"


@dataclasses.dataclass(frozen=True)
class AllocatorPeak:
    """One allocator over a profile, in bytes.

    Attributes:
      allocator: its name (`bfc_cpu_allocator_for_gpu`, `GPU_0_bfc`, ...).
      peak_bytes: the most it held at once (its chunks: what get_memory_info's peak
        reads for the same time).
      requested_bytes: the most that the tensors it held asked for at once.
      slack_bytes: at the moment of `peak_bytes`, what its chunks held beyond the
        requests of the tensors in them (allocated during the profile).
    """

    allocator: str
    peak_bytes: int
    requested_bytes: int
    slack_bytes: int


def _Stats(plane: Any, event: Any) -> dict:
    names = plane.stat_metadata
    out = {}
    for s in event.stats:
        kind = s.WhichOneof("value")
        value = getattr(s, kind) if kind else None
        if kind == "ref_value":
            value = names[s.ref_value].name
        out[names[s.metadata_id].name] = value
    return out


def Peaks(space: Any) -> dict[str, AllocatorPeak]:
    """Per allocator in the XSpace `space` (timeline.ReadXSpace), its AllocatorPeak; empty
    where the profile holds no memory events (a profiler without the host tracer)."""
    events = []
    for plane in space.planes:
        for line in plane.lines:
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                if name in (_ALLOC, _FREE):
                    time_ps = line.timestamp_ns * 1000 + ev.offset_ps
                    events.append((time_ps, len(events), name, _Stats(plane, ev)))
    events.sort(key=lambda e: e[:2])
    live: dict[str, dict] = {}  # allocator -> {address: (requested, chunk)}
    sums: dict[str, list[int]] = {}  # allocator -> [requested, chunk] of `live`
    out: dict[str, AllocatorPeak] = {}
    for _, _, name, st in events:
        allocator = str(st.get("allocator_name") or "")
        mine, total = live.setdefault(allocator, {}), sums.setdefault(allocator, [0, 0])
        address = st.get("addr")
        if name == _ALLOC:
            mine[address] = (
                int(st.get("requested_bytes") or 0),
                int(st.get("allocation_bytes") or 0),
            )
            total[0] += mine[address][0]
            total[1] += mine[address][1]
        elif address in mine:
            requested, chunk = mine.pop(address)
            total[0] -= requested
            total[1] -= chunk
        held = int(st.get("bytes_allocated") or 0)
        # What was allocated before the profile counts as its chunks.
        requested = held - total[1] + total[0]
        best = out.get(allocator) or AllocatorPeak(allocator, 0, 0, 0)
        if held > best.peak_bytes:
            best = dataclasses.replace(best, peak_bytes=held, slack_bytes=total[1] - total[0])
        if requested > best.requested_bytes:
            best = dataclasses.replace(best, requested_bytes=requested)
        out[allocator] = best
    return out

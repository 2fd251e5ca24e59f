"""lingpipe.pipeline.observe.allocations: an allocator's peak and what its tensors asked for,
read from a profile (a hand-made one with known figures, and one of a real step)."""

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from lingpipe.pipeline.observe import allocations, timeline

STATS = ("allocator_name", "bytes_allocated", "requested_bytes", "allocation_bytes", "addr")


def _Space(events):
    """An XSpace of one host line: (kind, address, requested, chunk, bytes held after)."""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    for i, name in enumerate(STATS, start=1):
        plane.stat_metadata[i].id, plane.stat_metadata[i].name = i, name
    for i, name in enumerate(("MemoryAllocation", "MemoryDeallocation"), start=1):
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, name
    line = plane.lines.add(timestamp_ns=1000)
    for t, (kind, address, requested, chunk, held) in enumerate(events):
        ev = line.events.add(metadata_id=1 if kind == "alloc" else 2, offset_ps=1000 * t)
        ev.stats.add(metadata_id=1, str_value="bfc")
        ev.stats.add(metadata_id=2, int64_value=held)
        ev.stats.add(metadata_id=5, uint64_value=address)
        if kind == "alloc":
            ev.stats.add(metadata_id=3, int64_value=requested)
            ev.stats.add(metadata_id=4, int64_value=chunk)
    return space


def test_the_peak_counts_chunks_and_the_requests_leave_out_their_slack():
    # 1000 bytes held before the profile (counted as they are). B asks for 300 and gets
    # a chunk of 500 (BFC does not split a chunk less than twice the request).
    space = _Space([
        ("alloc", 1, 100, 100, 1100),
        ("alloc", 2, 300, 500, 1600),
        ("free", 1, 0, 0, 1500),
        ("alloc", 3, 400, 400, 1900),
        ("free", 2, 0, 0, 1400),
    ])  # fmt: skip
    (peak,) = allocations.Peaks(space).values()
    assert (peak.allocator, peak.peak_bytes, peak.slack_bytes) == ("bfc", 1900, 200)
    assert peak.requested_bytes == 1000 + 300 + 400


def test_a_profile_without_memory_events_has_no_peaks():
    assert allocations.Peaks(_Space([])) == {}


def test_a_profiled_step_s_tensors_fit_in_its_peak(tmp_path):
    @tf.function
    def Step():
        with tf.device("/device:CPU:0"):
            a = tf.random.uniform([512, 512])  # 1 MiB
            b = tf.random.uniform([512, 512])
            return tf.reduce_sum(tf.matmul(a, b))  # a and b alive together

    Step()
    tf.profiler.experimental.start(str(tmp_path))
    Step()
    tf.profiler.experimental.stop()
    peaks = allocations.Peaks(timeline.ReadXSpace(timeline.LatestProfile(str(tmp_path))))
    cpu = max(peaks.values(), key=lambda p: p.peak_bytes)
    assert 2 * 2**20 <= cpu.requested_bytes <= cpu.peak_bytes

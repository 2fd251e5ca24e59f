"""tpu: device assignment over constructed topologies, and failing fast without a TPU."""

import itertools
import math
import re
import socket
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import tpu

# [x, y, z, cores_per_chip]: v3-like (2 cores per chip) and 1 core per chip, plus a 3-D mesh.
MESHES = [(2, 2, 1, 2), (2, 2, 1, 1), (4, 4, 1, 2), (4, 4, 1, 1), (2, 2, 2, 2)]
LAYOUTS = [(m, k) for m in MESHES for k in (2, 4, 8) if k <= math.prod(m)]

# ConnectTpu must answer within this; it takes milliseconds here.
FAST_S = 5.0


def _Topology(mesh, cores_per_task=8):
    """A full mesh whose cores belong to tasks (hosts) of cores_per_task each, in mesh order."""
    x, y, z, c = mesh
    coords = [
        (px, py, pz, pc)
        for pz, py, px, pc in itertools.product(range(z), range(y), range(x), range(c))
    ]
    per_task = min(cores_per_task, len(coords))
    return tf.tpu.experimental.Topology(
        mesh_shape=list(mesh), device_coordinates=np.array(coords).reshape(-1, per_task, 4)
    )


def _Cores(da, replica):
    return [tuple(int(v) for v in c) for c in da.core_assignment[replica]]


@pytest.mark.parametrize("mesh,num_stages", LAYOUTS)
def test_every_core_used_once_and_stages_are_neighbours(mesh, num_stages):
    da = tpu.ComputeDeviceAssignment(_Topology(mesh), num_stages)
    num_cores = math.prod(mesh)
    assert da.num_replicas == num_cores // num_stages
    assert da.num_cores_per_replica == num_stages
    assert da.core_assignment.shape == (num_cores // num_stages, num_stages, 4)
    used = []
    for replica in range(da.num_replicas):
        cores = _Cores(da, replica)
        assert len(set(cores)) == num_stages
        for core in cores:
            assert all(0 <= v < n for v, n in zip(core, mesh)), core
        for a, b in zip(cores, cores[1:]):
            distance = sum(abs(u - v) for u, v in zip(a, b))
            assert distance == 1, f"replica {replica}: {a} -> {b} are not neighbours"
        used.extend(cores)
    # Disjoint replicas that together use every core.
    assert sorted(used) == sorted(itertools.product(*[range(n) for n in mesh]))


def test_v3_chip_layout_is_the_snake():
    da = tpu.ComputeDeviceAssignment(_Topology((2, 2, 1, 2)), 4)
    # Both cores of a chip, then the next chip along x walked back through its cores.
    assert _Cores(da, 0) == [(0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 1), (1, 0, 0, 0)]
    assert _Cores(da, 1) == [(0, 1, 0, 0), (0, 1, 0, 1), (1, 1, 0, 1), (1, 1, 0, 0)]
    # One core per chip: a 2x2 square in snake order, not row-major (which would jump).
    da = tpu.ComputeDeviceAssignment(_Topology((4, 4, 1, 1)), 4)
    assert _Cores(da, 0) == [(0, 0, 0, 0), (1, 0, 0, 0), (1, 1, 0, 0), (0, 1, 0, 0)]


def test_fewer_replicas_are_a_prefix_and_disjoint():
    topology = _Topology((4, 4, 1, 2))
    full = tpu.ComputeDeviceAssignment(topology, 4)
    some = tpu.ComputeDeviceAssignment(topology, 4, num_replicas=3)
    assert some.core_assignment.shape == (3, 4, 4)
    np.testing.assert_array_equal(some.core_assignment, full.core_assignment[:3])
    cores = [tuple(c) for c in some.core_assignment.reshape(-1, 4)]
    assert len(set(cores)) == 12
    one = tpu.ComputeDeviceAssignment(topology, 32, num_replicas=1)
    assert one.core_assignment.shape == (1, 32, 4)


@pytest.mark.parametrize("mesh,num_stages", [((4, 4, 1, 2), 8), ((4, 4, 1, 1), 4)])
def test_stage_cores_agree_with_topology(mesh, num_stages):
    topology = _Topology(mesh, cores_per_task=8)
    da = tpu.ComputeDeviceAssignment(topology, num_stages)
    for replica in range(da.num_replicas):
        cores = tpu.StageCores(da, replica)
        assert [c.stage for c in cores] == list(range(num_stages))
        assert {c.replica for c in cores} == {replica}
        assert [c.coordinates for c in cores] == _Cores(da, replica)
        for c in cores:
            # The topology's own table: task `task`, device `tpu_ordinal` sits at these coordinates.
            np.testing.assert_array_equal(
                topology.device_coordinates[c.task, c.tpu_ordinal], c.coordinates
            )
            assert c.tpu_ordinal == da.tpu_ordinal(replica, c.stage)
            assert c.host_device == f"/task:{c.task}/device:CPU:0"
            assert c.tpu_device == f"/task:{c.task}/device:TPU:{c.tpu_ordinal}"
            assert replica in da.lookup_replicas(c.task, c.stage)
    # The mesh spans several hosts, and a host's replicas are found by lookup.
    assert topology.num_tasks == math.prod(mesh) // 8 > 1


def test_describe_lists_every_replica_and_stage():
    da = tpu.ComputeDeviceAssignment(_Topology((4, 4, 1, 2)), 8)
    text = tpu.DescribeAssignment(da)
    lines = text.splitlines()
    assert lines[0] == (
        "TPU device assignment: 4 replica(s) x 8 stage(s) on mesh [4, 4, 1, 2] "
        "(x, y, z, core), 4 task(s)"
    )
    assert lines[1].split() == ["replica", "stage", "x,", "y,", "z,", "core", "task", "ordinal"]
    rows = {}
    for line in lines[2:]:
        m = re.fullmatch(r"\s*(\d+)\s+(\d+)\s+(\d+), (\d+), (\d+), (\d+)\s+(\d+)\s+(\d+)", line)
        assert m, line
        replica, stage, *coords, task, ordinal = map(int, m.groups())
        rows[replica, stage] = (tuple(coords), task, ordinal)
    assert sorted(rows) == list(itertools.product(range(4), range(8)))
    for replica in range(4):
        for c in tpu.StageCores(da, replica):
            assert rows[replica, c.stage] == (c.coordinates, c.task, c.tpu_ordinal)


@pytest.mark.parametrize("num_stages", [0, -1, 2.0, True, None])
def test_bad_num_stages(num_stages):
    with pytest.raises(
        ValueError,
        match=r"ComputeDeviceAssignment: expected num_stages to be a positive integer, "
        rf"received num_stages={re.escape(repr(num_stages))}$",
    ):
        tpu.ComputeDeviceAssignment(_Topology((2, 2, 1, 2)), num_stages)


@pytest.mark.parametrize("num_replicas", [0, -2, 1.5])
def test_bad_num_replicas(num_replicas):
    with pytest.raises(
        ValueError,
        match=r"expected num_replicas to be a positive integer or None, "
        rf"received num_replicas={re.escape(repr(num_replicas))}$",
    ):
        tpu.ComputeDeviceAssignment(_Topology((2, 2, 1, 2)), 2, num_replicas)


def test_more_stages_than_cores():
    with pytest.raises(
        ValueError,
        match=r"num_stages=16 is more than the 8 cores of the TPU mesh \[2, 2, 1, 2\]; "
        r"each stage needs its own core: use num_stages <= 8 or a larger slice",
    ):
        tpu.ComputeDeviceAssignment(_Topology((2, 2, 1, 2)), 16)


def test_more_replicas_than_fit():
    with pytest.raises(
        ValueError,
        match=r"num_replicas=5 x num_stages=8 needs 40 cores but the TPU mesh "
        r"\[4, 4, 1, 2\] has 32; use num_replicas <= 4, or None for as many as fit",
    ):
        tpu.ComputeDeviceAssignment(_Topology((4, 4, 1, 2)), 8, num_replicas=5)


@pytest.mark.parametrize(
    "mesh,num_stages,works",
    [
        ((2, 2, 1, 2), 3, "[1, 2, 4, 8]"),
        ((4, 4, 1, 2), 6, "[1, 2, 4, 8, 16, 32]"),
        ((4, 4, 1, 1), 5, "[1, 2, 4, 8, 16]"),
    ],
)
def test_shape_that_cannot_tile_says_what_would(mesh, num_stages, works):
    with pytest.raises(
        ValueError,
        match=rf"num_stages={num_stages} cannot tile the TPU mesh {re.escape(str(list(mesh)))}"
        rf" \({math.prod(mesh)} cores\): a replica's cores form a block whose sides divide "
        rf"the mesh \[x, y, z, cores_per_chip\]; num_stages that tile it: {re.escape(works)}",
    ):
        tpu.ComputeDeviceAssignment(_Topology(mesh), num_stages, num_replicas=1)


def test_not_a_topology_and_degraded_slice():
    with pytest.raises(
        ValueError, match=r"expected topology to be a tf.tpu.experimental.Topology, received str"
    ):
        tpu.ComputeDeviceAssignment("v3-8", 2)
    # A 2x2x1x2 mesh whose last chip is missing.
    coords = np.array([[[x, y, 0, c] for y in range(2) for x in range(2) for c in range(2)][:6]])
    degraded = tf.tpu.experimental.Topology(mesh_shape=[2, 2, 1, 2], device_coordinates=coords)
    with pytest.raises(
        ValueError,
        match=r"the TPU mesh \[2, 2, 1, 2\] has 2 missing core\(s\) \(a degraded slice\)",
    ):
        tpu.ComputeDeviceAssignment(degraded, 2)


def test_stage_cores_and_describe_errors():
    da = tpu.ComputeDeviceAssignment(_Topology((2, 2, 1, 2)), 4)
    for replica in (2, -1, True):
        with pytest.raises(
            ValueError,
            match=rf"StageCores: expected replica in \[0, 2\), received replica={replica!r}$",
        ):
            tpu.StageCores(da, replica)
    with pytest.raises(
        ValueError,
        match=r"DescribeAssignment: expected device_assignment to be a "
        r"tf.tpu.experimental.DeviceAssignment, received ndarray",
    ):
        tpu.DescribeAssignment(da.core_assignment)


def _ClosedPort():
    """A local port that nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_cloud(monkeypatch):
    """No TPU named in the environment, and a GCE metadata server that refuses at once."""
    for name in ("TPU_NAME", "TPU_CONFIG", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "GCE_METADATA_IP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{_ClosedPort()}")
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")


def _ConnectError(tpu_name, **kwargs):
    """The ValueError that ConnectTpu raises, waited for at most FAST_S seconds."""
    outcome = {}

    def Run():
        try:
            tpu.ConnectTpu(tpu_name, **kwargs)
        except Exception as e:
            outcome["error"] = e

    start = time.monotonic()
    thread = threading.Thread(target=Run, daemon=True)
    thread.start()
    thread.join(FAST_S)
    assert not thread.is_alive(), f"ConnectTpu({tpu_name!r}) still waiting after {FAST_S}s"
    assert time.monotonic() - start < FAST_S
    assert isinstance(outcome.get("error"), ValueError), outcome
    return str(outcome["error"])


def _AssertSaysWhatToPass(message, tpu_name):
    assert message.startswith(f"ConnectTpu: no TPU could be reached for tpu_name={tpu_name!r}: "), (
        message
    )
    assert message.endswith(
        "pass --tpu=NAME with the name of a Cloud TPU (or its grpc://HOST:PORT address), "
        "or run on a TPU VM with --tpu=local"
    ), message


@pytest.mark.usefixtures("no_cloud")
def test_connect_without_a_name_fails_at_once():
    message = _ConnectError(None)
    _AssertSaysWhatToPass(message, None)
    assert "looking up the TPU failed with ValueError: Please provide a TPU Name" in message


@pytest.mark.usefixtures("no_cloud")
def test_connect_to_a_name_that_does_not_exist_fails_at_once():
    message = _ConnectError("no-such-tpu")
    _AssertSaysWhatToPass(message, "no-such-tpu")
    assert "looking up the TPU failed with URLError" in message


def test_connect_to_an_address_where_nothing_listens_fails_at_once():
    # TensorFlow alone would wait forever here; the probe answers at once.
    address = f"grpc://127.0.0.1:{_ClosedPort()}"
    message = _ConnectError(address)
    _AssertSaysWhatToPass(message, address)
    assert f"opening a connection to its master {address} failed with Connection" in message


def test_connect_gives_up_after_timeout_when_tensorflow_waits(monkeypatch):
    # Something accepts the connection but never answers, and TensorFlow waits on
    # it: stand in for TensorFlow's wait (a real one would also block this process).
    release = threading.Event()
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: release.wait())
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        address = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        try:
            message = _ConnectError(address, timeout_s=0.5)
        finally:
            release.set()
    _AssertSaysWhatToPass(message, address)
    assert "no answer within timeout_s=0.5 while connecting to and initializing" in message


def test_connect_local_without_tpu_fails_at_once():
    message = _ConnectError("local")
    _AssertSaysWhatToPass(message, "local")
    assert "initializing the TPU system failed with NotFoundError: TPUs not found" in message


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"tpu_name": 3}, r"expected tpu_name to be a string or None, received int: 3$"),
        ({"tpu_name": None, "timeout_s": 0}, r"positive number of seconds, received timeout_s=0$"),
    ],
)
def test_connect_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tpu.ConnectTpu(**kwargs)


@pytest.mark.usefixtures("no_cloud")
def test_build_strategy_without_tpu_fails_at_once():
    message = _BuildError("no-such-tpu", 2)
    _AssertSaysWhatToPass(message, "no-such-tpu")
    # Bad stage counts are reported before any connection is tried.
    with pytest.raises(ValueError, match=r"BuildTpuStrategy: expected num_stages to be a positive"):
        tpu.BuildTpuStrategy("no-such-tpu", 0)
    with pytest.raises(ValueError, match=r"BuildTpuStrategy: expected num_replicas to be a"):
        tpu.BuildTpuStrategy("no-such-tpu", 2, num_replicas=0)


def _BuildError(tpu_name, num_stages):
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        tpu.BuildTpuStrategy(tpu_name, num_stages)
    assert time.monotonic() - start < FAST_S
    return str(info.value)


def test_build_strategy_wires_the_assignment(monkeypatch):
    topology = _Topology((2, 2, 1, 2))
    resolver = object()
    monkeypatch.setattr(tpu, "ConnectTpu", lambda name, timeout_s: (resolver, topology))
    made = {}

    def FakeStrategy(r, experimental_device_assignment):
        made.update(resolver=r, da=experimental_device_assignment)
        return "strategy"

    monkeypatch.setattr(tf.distribute, "TPUStrategy", FakeStrategy)
    strategy, da = tpu.BuildTpuStrategy("v3-8", 4)
    assert strategy == "strategy"
    assert made == {"resolver": resolver, "da": da}
    np.testing.assert_array_equal(
        da.core_assignment, tpu.ComputeDeviceAssignment(topology, 4).core_assignment
    )


class _FakeTpuStrategy:
    """What AssignToStage reads from a TPUStrategy: the [replicas, cores] device table."""

    def __init__(self, num_replicas, num_cores):
        self.extended = type("Extended", (), {})()
        self.extended._tpu_devices = np.full((num_replicas, num_cores), "TPU", dtype=object)
        self.calls = []

    def experimental_assign_to_logical_device(self, tensor, logical_device_id):
        self.calls.append(logical_device_id)
        return tensor


def test_assign_to_stage():
    strategy = _FakeTpuStrategy(num_replicas=2, num_cores=4)
    x = tf.constant([1.0])
    for stage in range(4):
        assert tpu.AssignToStage(strategy, x, stage) is x
    assert strategy.calls == [0, 1, 2, 3]
    for stage in (4, -1, 1.0, True):
        with pytest.raises(
            ValueError,
            match=r"AssignToStage: expected stage in \[0, 4\) \(the strategy has 4 core\(s\) "
            rf"per replica, one per stage\), received stage={stage!r}; build the strategy "
            r"with BuildTpuStrategy\(..., num_stages=K\)",
        ):
            tpu.AssignToStage(strategy, x, stage)
    assert strategy.calls == [0, 1, 2, 3]


def test_assign_to_stage_needs_a_tpu_strategy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(
        ValueError,
        match=r"AssignToStage: expected a tf.distribute.TPUStrategy \(from BuildTpuStrategy\), "
        r"received MirroredStrategy; logical cores exist only on TPU",
    ):
        tpu.AssignToStage(strategy, tf.constant(1.0), 0)

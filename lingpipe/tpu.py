"""Pipeline stages on TPU cores: device assignment, connection and strategy.

A pipeline of K stages runs on TPU through `tf.distribute.TPUStrategy` with a
`tf.tpu.experimental.DeviceAssignment` that gives each replica K cores; stage k
runs on logical core k of its replica, and the replicas are the data-parallel
copies. Everything here except `ConnectTpu` and `BuildTpuStrategy` is plain
Python over a `Topology`, so it is tested without a TPU.

Layout. A replica's K cores form a block of the mesh [x, y, z, core] whose
sides divide the mesh, and the stages walk that block in snake (boustrophedon)
order, core axis fastest: stage k and stage k + 1 are always physical
neighbours, either the two cores of one chip or adjacent chips. The blocks tile
the mesh, so replicas never share a core; they are taken in snake order too, so
that a partial set of replicas stays compact.

    topology = tf.tpu.experimental.Topology(mesh_shape=[2, 2, 1, 2], ...)
    da = ComputeDeviceAssignment(topology, num_stages=4)   # 2 replicas x 4 stages
    print(DescribeAssignment(da))
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

__all__ = [
    "AssignToStage",
    "BuildTpuStrategy",
    "ComputeDeviceAssignment",
    "ConnectTpu",
    "DescribeAssignment",
    "StageCore",
    "StageCores",
]

_T = TypeVar("_T")

# Masters that mean "the TPU is attached to this VM": nothing to probe over the network.
_LOCAL_MASTERS = ("", "local")

_HOW_TO_FIX = (
    "pass --tpu=NAME with the name of a Cloud TPU (or its grpc://HOST:PORT address), "
    "or run on a TPU VM with --tpu=local"
)


@dataclasses.dataclass(frozen=True)
class StageCore:
    """Where one pipeline stage of one replica runs.

    Attributes:
      replica: the data-parallel replica.
      stage: the pipeline stage; it is also the logical core within the replica.
      coordinates: physical (x, y, z, core) of the TPU core in the mesh.
      task: the TensorFlow task (host) that owns the core.
      tpu_ordinal: the core's device ordinal within its task, i.e. TPU:<ordinal>.
      tpu_device: e.g. '/task:0/device:TPU:3'.
      host_device: the CPU of the owning host, e.g. '/task:0/device:CPU:0'.
    """

    replica: int
    stage: int
    coordinates: tuple[int, int, int, int]
    task: int
    tpu_ordinal: int
    tpu_device: str
    host_device: str


def _CheckCount(fn: str, value: Any, name: str, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "a positive integer" + (" or None" if allow_none else "")
        raise ValueError(f"{fn}: expected {name} to be {expected}, received {name}={value!r}")


def _Divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _Snake(sizes: list[int]) -> list[tuple[int, ...]]:
    """All points of a box, each a neighbour of the one before (reflected Gray code).

    Args:
      sizes: the box's sides, fastest-varying axis first.

    Returns:
      prod(sizes) index tuples in the order of `sizes`; consecutive tuples differ
      by 1 in exactly one axis, because each slower step reverses the walk of the
      faster axes instead of jumping back to their start.
    """
    if not sizes:
        return [()]
    inner = _Snake(sizes[:-1])
    walk = []
    for i in range(sizes[-1]):
        for point in inner if i % 2 == 0 else reversed(inner):
            walk.append(point + (i,))
    return walk


def _SnakeXyzc(shape: list[int]) -> list[tuple[int, int, int, int]]:
    """Snake over a [x, y, z, core] box with the core axis fastest, then x, y, z."""
    x, y, z, c = shape
    return [(px, py, pz, pc) for pc, px, py, pz in _Snake([c, x, y, z])]


def _BlockShape(mesh: list[int], num_stages: int) -> list[int] | None:
    """The [x, y, z, core] block of one replica, or None when num_stages cannot tile the mesh.

    Prefers the cores of one chip (the fastest link), then compact blocks (small
    longest side), then staying within one z plane.
    """
    shapes = [
        list(s)
        for s in itertools.product(*[_Divisors(n) for n in mesh])
        if math.prod(s) == num_stages
    ]
    if not shapes:
        return None
    return min(shapes, key=lambda s: (-s[3], max(s[:3]), s[2], s[1]))


def _TilingStageCounts(mesh: list[int]) -> list[int]:
    counts = {math.prod(s) for s in itertools.product(*[_Divisors(n) for n in mesh])}
    return sorted(counts)


def ComputeDeviceAssignment(
    topology: tf.tpu.experimental.Topology,
    num_stages: int,
    num_replicas: int | None = None,
) -> tf.tpu.experimental.DeviceAssignment:
    """Gives each replica `num_stages` neighbouring TPU cores, one per pipeline stage.

    Args:
      topology: the TPU slice, from `initialize_tpu_system` (or constructed, in
        tests); mesh_shape is [x, y, z, cores_per_chip].
      num_stages: K, the pipeline's stages; logical core k of a replica runs stage k.
      num_replicas: data-parallel replicas; None takes as many as fit
        (cores // num_stages).

    Returns:
      A DeviceAssignment whose core_assignment is [num_replicas, num_stages, 4]:
      replicas on disjoint cores, consecutive stages on adjacent cores.

    Raises:
      ValueError: a bad argument, more cores asked for than the mesh has, a
        num_stages whose block cannot tile the mesh (the message lists those that
        can), or a degraded slice with missing cores.
    """
    fn = "ComputeDeviceAssignment"
    if not isinstance(topology, tf.tpu.experimental.Topology):
        raise ValueError(
            f"{fn}: expected topology to be a tf.tpu.experimental.Topology, received "
            f"{type(topology).__name__}: {topology!r}"
        )
    _CheckCount(fn, num_stages, "num_stages")
    _CheckCount(fn, num_replicas, "num_replicas", allow_none=True)
    mesh = [int(n) for n in topology.mesh_shape]
    num_cores = math.prod(mesh)
    if topology.missing_devices.size:
        raise ValueError(
            f"{fn}: the TPU mesh {mesh} has {len(topology.missing_devices)} missing core(s) "
            f"(a degraded slice); this layout needs every core of the mesh; use "
            f"tf.tpu.experimental.DeviceAssignment.build for degraded slices"
        )
    if num_stages > num_cores:
        raise ValueError(
            f"{fn}: num_stages={num_stages} is more than the {num_cores} cores of the TPU "
            f"mesh {mesh}; each stage needs its own core: use num_stages <= {num_cores} "
            f"or a larger slice"
        )
    if num_replicas is not None and num_replicas * num_stages > num_cores:
        raise ValueError(
            f"{fn}: num_replicas={num_replicas} x num_stages={num_stages} needs "
            f"{num_replicas * num_stages} cores but the TPU mesh {mesh} has {num_cores}; "
            f"use num_replicas <= {num_cores // num_stages}, or None for as many as fit"
        )
    block = _BlockShape(mesh, num_stages)
    if block is None:
        raise ValueError(
            f"{fn}: num_stages={num_stages} cannot tile the TPU mesh {mesh} "
            f"({num_cores} cores): a replica's cores form a block whose sides divide the "
            f"mesh [x, y, z, cores_per_chip]; num_stages that tile it: "
            f"{_TilingStageCounts(mesh)}"
        )
    grid = [m // b for m, b in zip(mesh, block)]
    if num_replicas is None:
        num_replicas = math.prod(grid)
    inner = np.array(_SnakeXyzc(block), dtype=np.int32)  # [num_stages, 4]
    offsets = np.array(_SnakeXyzc(grid)[:num_replicas], dtype=np.int32) * np.array(block)
    core_assignment = offsets[:, np.newaxis, :] + inner[np.newaxis, :, :]
    return tf.tpu.experimental.DeviceAssignment(topology, core_assignment)


def _CheckAssignment(fn: str, device_assignment: Any) -> None:
    if not isinstance(device_assignment, tf.tpu.experimental.DeviceAssignment):
        raise ValueError(
            f"{fn}: expected device_assignment to be a tf.tpu.experimental.DeviceAssignment, "
            f"received {type(device_assignment).__name__}: {device_assignment!r}"
        )


def StageCores(
    device_assignment: tf.tpu.experimental.DeviceAssignment, replica: int
) -> list[StageCore]:
    """Where each stage of `replica` runs: num_cores_per_replica entries, stage order."""
    fn = "StageCores"
    _CheckAssignment(fn, device_assignment)
    n = device_assignment.num_replicas
    if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < n:
        raise ValueError(f"{fn}: expected replica in [0, {n}), received replica={replica!r}")
    topology = device_assignment.topology
    cores = []
    for stage in range(device_assignment.num_cores_per_replica):
        coordinates = tuple(int(c) for c in device_assignment.coordinates(replica, stage))
        cores.append(
            StageCore(
                replica=replica,
                stage=stage,
                coordinates=coordinates,
                task=int(topology.task_ordinal_at_coordinates(coordinates)),
                tpu_ordinal=int(device_assignment.tpu_ordinal(replica, stage)),
                tpu_device=device_assignment.tpu_device(replica, stage),
                host_device=device_assignment.host_device(replica, stage),
            )
        )
    return cores


def DescribeAssignment(device_assignment: tf.tpu.experimental.DeviceAssignment) -> str:
    """A table of every (replica, stage) and its core, for printing at start-up."""
    _CheckAssignment("DescribeAssignment", device_assignment)
    topology = device_assignment.topology
    mesh = [int(n) for n in topology.mesh_shape]
    lines = [
        f"TPU device assignment: {device_assignment.num_replicas} replica(s) x "
        f"{device_assignment.num_cores_per_replica} stage(s) on mesh {mesh} "
        f"(x, y, z, core), {topology.num_tasks} task(s)",
        f"{'replica':>7}  {'stage':>5}  {'x, y, z, core':<14}  {'task':>4}  {'ordinal':>7}",
    ]
    for replica in range(device_assignment.num_replicas):
        for core in StageCores(device_assignment, replica):
            where = ", ".join(str(c) for c in core.coordinates)
            lines.append(
                f"{core.replica:>7}  {core.stage:>5}  {where:<14}  {core.task:>4}  "
                f"{core.tpu_ordinal:>7}"
            )
    return "\n".join(lines)


def _CallWithDeadline(fn: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """fn() in a daemon thread; raises TimeoutError if it has not returned in timeout_s.

    TensorFlow's connection calls block without a timeout of their own when
    nobody answers; the thread is abandoned then, so the caller gets an error
    rather than a hang.
    """
    outcome: dict[str, Any] = {}

    def Run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread below
            outcome["error"] = e

    thread = threading.Thread(target=Run, name=f"ConnectTpu: {what}", daemon=True)
    thread.start()
    thread.join(max(timeout_s, 0.0))
    if thread.is_alive():
        raise TimeoutError(f"no answer while {what}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _ProbeMaster(master: str, timeout_s: float) -> None:
    """Raises OSError unless something accepts a TCP connection at the master's host:port.

    `experimental_connect_to_cluster` waits forever (holding TensorFlow's context,
    so no other op runs either) when nothing listens at the address; a plain
    socket answers at once when the port is closed, or within timeout_s.
    """
    address = master.split("://", 1)[-1]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return  # not a host:port address; TensorFlow will say what is wrong with it
    with socket.create_connection((host.strip("[]"), int(port)), timeout=max(timeout_s, 0.1)):
        pass


def ConnectTpu(
    tpu_name: str | None, timeout_s: float = 300.0
) -> tuple[tf.distribute.cluster_resolver.TPUClusterResolver, tf.tpu.experimental.Topology]:
    """Connects to a TPU and initializes it; returns (resolver, topology).

    Args:
      tpu_name: a Cloud TPU name, a 'grpc://host:port' address, 'local' for a TPU
        VM, or None to let TPUClusterResolver find one ($TPU_NAME, the VM's metadata).
      timeout_s: the longest the whole connection may take; initializing a large
        slice takes minutes.

    Raises:
      ValueError: no TPU could be reached (the message names tpu_name, says why
        and what to pass instead), at once where TensorFlow fails at once, and
        after at most timeout_s where it would wait.
    """
    fn = "ConnectTpu"
    if tpu_name is not None and not isinstance(tpu_name, str):
        raise ValueError(
            f"{fn}: expected tpu_name to be a string or None, received "
            f"{type(tpu_name).__name__}: {tpu_name!r}"
        )
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(
            f"{fn}: expected timeout_s to be a positive number of seconds, received "
            f"timeout_s={timeout_s!r}"
        )
    deadline = time.monotonic() + timeout_s

    def Remaining() -> float:
        return deadline - time.monotonic()

    def Connect() -> tf.tpu.experimental.Topology:
        tf.config.experimental_connect_to_cluster(resolver)
        return tf.tpu.experimental.initialize_tpu_system(resolver)

    step = "looking up the TPU"
    try:
        resolver = _CallWithDeadline(
            lambda: tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_name),
            Remaining(),
            step,
        )
        master = resolver.master()
        if master not in _LOCAL_MASTERS:
            step = f"opening a connection to its master {master}"
            _ProbeMaster(master, Remaining())
        step = "connecting to and initializing the TPU system"
        topology = _CallWithDeadline(Connect, Remaining(), step)
    except TimeoutError as e:
        raise ValueError(
            f"{fn}: no TPU could be reached for tpu_name={tpu_name!r}: no answer within "
            f"timeout_s={timeout_s} while {step} (TensorFlow may still be waiting on it: "
            f"retry in a new process); {_HOW_TO_FIX}"
        ) from e
    except (ValueError, RuntimeError, OSError, ImportError, tf.errors.OpError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ValueError(
            f"{fn}: no TPU could be reached for tpu_name={tpu_name!r}: {step} failed with "
            f"{type(e).__name__}: {reason}; {_HOW_TO_FIX}"
        ) from e
    return resolver, topology


def BuildTpuStrategy(
    tpu_name: str | None,
    num_stages: int,
    num_replicas: int | None = None,
    timeout_s: float = 300.0,
) -> tuple[tf.distribute.TPUStrategy, tf.tpu.experimental.DeviceAssignment]:
    """A TPUStrategy whose replicas each run the num_stages stages on neighbouring cores.

    Returns:
      (strategy, device_assignment); place stage k's tensors with
      AssignToStage(strategy, tensor, k) inside strategy.run.

    Raises:
      ValueError: a bad num_stages or num_replicas (checked before connecting),
        no TPU reachable, or a layout that does not fit the slice.
    """
    _CheckCount("BuildTpuStrategy", num_stages, "num_stages")
    _CheckCount("BuildTpuStrategy", num_replicas, "num_replicas", allow_none=True)
    resolver, topology = ConnectTpu(tpu_name, timeout_s)
    device_assignment = ComputeDeviceAssignment(topology, num_stages, num_replicas)
    strategy = tf.distribute.TPUStrategy(resolver, experimental_device_assignment=device_assignment)
    return strategy, device_assignment


def AssignToStage(strategy: tf.distribute.TPUStrategy, tensor: Any, stage: int) -> Any:
    """Places `tensor` (and the ops that consume it) on logical core `stage` of each replica.

    Call inside `strategy.run`; without it every op of a replica runs on logical
    core 0. A thin check around `strategy.experimental_assign_to_logical_device`.

    Raises:
      ValueError: strategy is not a TPUStrategy, or stage is not in
        [0, cores per replica).
    """
    fn = "AssignToStage"
    # TPUStrategy has no public count of cores per replica; `_tpu_devices`
    # ([replicas, cores per replica] device names) is what its own check reads.
    devices = getattr(getattr(strategy, "extended", None), "_tpu_devices", None)
    if devices is None or not hasattr(strategy, "experimental_assign_to_logical_device"):
        raise ValueError(
            f"{fn}: expected a tf.distribute.TPUStrategy (from BuildTpuStrategy), received "
            f"{type(strategy).__name__}; logical cores exist only on TPU"
        )
    num_cores = int(np.shape(devices)[1])
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < num_cores:
        raise ValueError(
            f"{fn}: expected stage in [0, {num_cores}) (the strategy has {num_cores} "
            f"core(s) per replica, one per stage), received stage={stage!r}; build the "
            f"strategy with BuildTpuStrategy(..., num_stages=K) for a K-stage pipeline"
        )
    return strategy.experimental_assign_to_logical_device(tensor, stage)

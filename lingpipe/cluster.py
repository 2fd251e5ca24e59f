"""Devices that pipeline stages may use, and logical CPU devices that stand in for them.

Accelerators come first: TPU cores when present, else GPUs, else the CPU's
logical devices. `SetLogicalCpuDevices(n)` splits the one physical CPU into n
logical devices so that a pipeline can be built and tested on a machine without
accelerators; it must run before TensorFlow initializes its devices.

Devices of this process have short names ('/device:GPU:1'). Once a client has
connected to a cluster (`tf.config.experimental_connect_to_cluster`, see
lingpipe.runners.hosts), the devices of other processes keep their full names
('/job:worker/replica:0/task:1/device:CPU:0'): `TaskDevices` lists them per task,
and `CanonicalDevice` accepts them, so that stages can be placed on other hosts.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

__all__ = [
    "AvailableDevices",
    "CanonicalDevice",
    "DescribeGroups",
    "DeviceNames",
    "HostOf",
    "MAX_LOGICAL_CPU_DEVICES",
    "PipelineDevices",
    "ReplicaDeviceGroups",
    "ReplicaDevices",
    "SetLogicalCpuDevices",
    "StageDevices",
    "TaskDevices",
    "VariableDevice",
]

# TensorFlow accepts many more, but each logical CPU device costs threads and
# memory; beyond this a pipeline on one CPU is a mistake, not an experiment.
MAX_LOGICAL_CPU_DEVICES = 64

_ACCELERATOR_ORDER = ("TPU", "GPU", "CPU")

# The device group of the replica being built (see ReplicaDevices), per thread.
_REPLICA = threading.local()


def SetLogicalCpuDevices(n: int) -> None:
    """Splits the physical CPU into `n` logical devices /device:CPU:0..n-1.

    Idempotent: asking again for the number already set does nothing.

    Also makes the CPU allocator count every allocation in its statistics
    (TF_CPU_ALLOCATOR_USE_BFC=true, unless the environment sets it): oneDNN's default
    CPU allocator counts only those of 256 KiB and up, so a measured peak
    (`tf.config.experimental.get_memory_info('CPU:0')`) would leave out small
    micro-batches' activations. It takes effect if TensorFlow has not yet
    initialized its devices, as this function requires anyway.

    Raises:
      ValueError: n is not an integer in [1, MAX_LOGICAL_CPU_DEVICES].
      RuntimeError: TensorFlow has already initialized its devices with a
        different number of logical CPU devices.
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LOGICAL_CPU_DEVICES:
        raise ValueError(
            f"SetLogicalCpuDevices: expected an integer in [1, {MAX_LOGICAL_CPU_DEVICES}], "
            f"received n={n!r}"
        )
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is not None and len(current) == n:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError as e:
        have = len(tf.config.list_logical_devices("CPU"))
        raise RuntimeError(
            f"SetLogicalCpuDevices({n}): TensorFlow has already initialized its devices "
            f"with {have} logical CPU device(s); call it before any other TensorFlow "
            f"work (at the top of the program, or in tests/conftest.py)"
        ) from e


def AvailableDevices(device_type: str | None = None) -> list[str]:
    """Names of the devices stages may use, e.g. ['/device:GPU:0', '/device:GPU:1'].

    Args:
      device_type: 'TPU', 'GPU' or 'CPU'; None takes the first kind present in
        that order.
    """
    if device_type is not None:
        device_type = device_type.upper()
        if device_type not in _ACCELERATOR_ORDER:
            raise ValueError(
                f"AvailableDevices: expected device_type in {list(_ACCELERATOR_ORDER)} or "
                f"None, received device_type={device_type!r}"
            )
        kinds = [device_type]
    else:
        kinds = list(_ACCELERATOR_ORDER)
    for kind in kinds:
        # A client connected to a cluster lists the other tasks' devices too: not ours.
        devices = [d for d in tf.config.list_logical_devices(kind) if _IsLocal(_Spec(d.name))]
        if devices:
            # A connected client lists its own devices twice (short and full name).
            return list(dict.fromkeys(_ShortName(d.name) for d in devices))
    return []


@contextlib.contextmanager
def ReplicaDevices(devices: Sequence[str]) -> Iterator[list[str]]:
    """Within, pipelines built without explicit devices use this replica's `devices`.

    for group in cluster.ReplicaDeviceGroups(num_stages=4):   # [[CPU:0..3], [CPU:4..7]]
      with cluster.ReplicaDevices(group):
        copies.append(task_params.Instantiate())            # stage k on group[k]
    """
    group = [CanonicalDevice(d) for d in devices]
    previous = getattr(_REPLICA, "devices", None)
    _REPLICA.devices = group
    try:
        yield group
    finally:
        _REPLICA.devices = previous


def StageDevices(num_stages: int, device_type: str | None = None) -> list[str]:
    """The first `num_stages` devices of the replica's group (see ReplicaDevices), else of
    AvailableDevices(device_type)."""
    group = getattr(_REPLICA, "devices", None)
    if group is not None and device_type is None:
        if num_stages > len(group):
            raise ValueError(
                f"StageDevices: asked for {num_stages} devices for pipeline stages but this "
                f"replica's device group has {len(group)}: {group}"
            )
        return group[:num_stages]
    devices = AvailableDevices(device_type)
    if num_stages > len(devices):
        kind = device_type or (_DeviceType(devices[0]) if devices else "any")
        raise ValueError(
            f"StageDevices: asked for {num_stages} devices for pipeline stages but this "
            f"machine has {len(devices)} {kind} device(s): {devices}; lower num_stages, "
            f"or split the CPU with SetLogicalCpuDevices({num_stages}) (--logical_devices)"
        )
    return devices[:num_stages]


def DeviceNames(devices: Any, where: str) -> list[str] | None:
    """`devices` (a pipeline's, one per stage) as a list, or None; a number or a single
    name is one ValueError line beginning with `where` (a string would otherwise be
    read as its characters)."""
    if devices is None:
        return None
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        hint = ""
        if isinstance(devices, int) and not isinstance(devices, bool):
            hint = f" (for {devices} stages on the first {devices} devices, num_stages={devices})"
        raise ValueError(
            f"{where}: expected devices to be a list of device names, one per stage, or None "
            f"for the first num_stages devices; received devices={devices!r}{hint}"
        )
    return list(devices)


def PipelineDevices(
    devices: Sequence[str] | None, num_stages: int, where: str = "pipeline"
) -> list[str]:
    """A pipeline's devices: `devices` (one per stage) as CanonicalDevice names, or for
    None the first `num_stages` StageDevices; errors begin with `where`."""
    devices = DeviceNames(devices, where)
    if devices is None:
        try:
            return StageDevices(num_stages)
        except ValueError as e:
            raise ValueError(f"{where}: num_stages={num_stages}: {e}") from None
    if len(devices) != num_stages:
        raise ValueError(
            f"{where}: expected one device per stage, received {len(devices)} device(s) "
            f"{list(devices)} for num_stages={num_stages}"
        )
    try:
        return [CanonicalDevice(d) for d in devices]
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def ReplicaDeviceGroups(
    num_stages: int, num_replicas: int | None = None, devices: Sequence[str] | None = None
) -> list[list[str]]:
    """Splits `devices` (default: AvailableDevices()) into groups of `num_stages`, one per replica.

    Group r is devices[r*K : (r+1)*K]: consecutive devices, which on a GPU host are
    usually the ones with the fastest links between them. num_replicas None takes
    as many groups as fit; devices left over stay idle.

    Raises:
      ValueError: fewer devices than one group, or than num_replicas groups.
    """
    devices = list(AvailableDevices() if devices is None else devices)
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"ReplicaDeviceGroups: expected num_stages >= 1, received {num_stages!r}")
    fit = len(devices) // num_stages
    if num_replicas is None:
        num_replicas = max(fit, 1)
    if num_replicas > fit or num_replicas < 1:
        raise ValueError(
            f"ReplicaDeviceGroups: {num_replicas} replica(s) of {num_stages} stage(s) need "
            f"{num_replicas * num_stages} devices, but there are {len(devices)}: "
            f"{devices}; lower num_stages or the replicas, or split the CPU into more "
            "logical devices (--logical_devices)"
        )
    return [devices[r * num_stages : (r + 1) * num_stages] for r in range(num_replicas)]


def DescribeGroups(groups: Sequence[Sequence[str]], all_devices: Sequence[str] = ()) -> str:
    """'replica 0: stages on /device:CPU:0, /device:CPU:1' lines, and the idle devices."""
    lines = [
        f"replica {r}: stage {', stage '.join(f'{k} on {d}' for k, d in enumerate(g))}"
        for r, g in enumerate(groups)
    ]
    used = {d for g in groups for d in g}
    idle = [d for d in all_devices if d not in used]
    if idle:
        lines.append(f"idle: {', '.join(idle)}")
    return "\n".join(lines)


def CanonicalDevice(name: str) -> str:
    """Returns the short name of an existing device, or raises a ValueError listing those that do.

    Accepts '/device:CPU:1', '/cpu:1', 'CPU:1', 'GPU:0', or full names with job/replica/task.
    """
    try:
        spec = tf.DeviceSpec.from_string(name if name.startswith("/") else "/device:" + name)
    except (ValueError, TypeError) as e:
        raise ValueError(f"device name {name!r} is not a TensorFlow device name") from e
    short = f"/device:{(spec.device_type or '').upper()}:{spec.device_index}"
    if spec.job is not None and not _IsLocal(spec):
        full = f"/job:{spec.job}/replica:{spec.replica or 0}/task:{spec.task or 0}{short}"
        remote = sorted(d for task in TaskDevices(spec.job).values() for d in task)
        if full not in remote:
            raise ValueError(
                f"device {name!r} does not exist; the job {spec.job!r} of the connected "
                f"cluster has {remote or 'no devices (is this process connected to it?)'}"
            )
        return full
    existing = {_ShortName(d.name) for d in _LogicalDevices() if _IsLocal(_Spec(d.name))}
    if short not in existing:
        raise ValueError(f"device {name!r} does not exist; this process has {sorted(existing)}")
    return short


def TaskDevices(job: str = "worker", device_type: str | None = None) -> dict[int, list[str]]:
    """{task index: full device names} of `job`'s tasks in the connected cluster.

    Each task's devices come accelerators first (TPU, GPU, then CPU), each kind in
    index order; `device_type` keeps one kind. Empty when this process is not
    connected to a cluster with that job.
    """
    out: dict[int, list[str]] = {}
    for d in _LogicalDevices():
        spec = _Spec(d.name)
        if spec.job != job or _IsLocal(spec):
            continue
        if device_type is not None and spec.device_type != device_type.upper():
            continue
        out.setdefault(spec.task or 0, []).append(
            f"/job:{job}/replica:{spec.replica or 0}/task:{spec.task or 0}"
            f"/device:{spec.device_type}:{spec.device_index}"
        )

    def Order(name: str) -> tuple[int, int]:
        spec = _Spec(name)
        kind = spec.device_type
        rank = (
            _ACCELERATOR_ORDER.index(kind)
            if kind in _ACCELERATOR_ORDER
            else len(_ACCELERATOR_ORDER)
        )
        return rank, spec.device_index or 0

    return {task: sorted(names, key=Order) for task, names in sorted(out.items())}


def HostOf(device: str) -> str:
    """'worker 1' for a device of task 1 of job worker; 'local' for this process's devices."""
    spec = _Spec(device)
    if spec.job is None or _IsLocal(spec):
        return "local"
    return f"{spec.job} {spec.task or 0}"


def VariableDevice(variable: Any) -> str:
    """The device of a tf.Variable, or of a keras.Variable's tf.Variable (a keras.Variable
    has no device of its own)."""
    device = getattr(variable, "device", None)
    return variable.value.device if device is None else device


def _LogicalDevices() -> list:
    return tf.config.list_logical_devices()


def _Spec(name: str) -> tf.DeviceSpec:
    return tf.DeviceSpec.from_string(name if name.startswith("/") else "/device:" + name)


def _LocalTask() -> tuple[str, int] | None:
    """(job, task) of this process in the connected cluster; None when not connected.

    A client connected with experimental_connect_to_cluster has a server def; a
    MultiWorkerMirroredStrategy worker has only the collective ops' one (its devices
    are listed by their full names too)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    server_def = ctx._server_def or ctx._collective_ops_server_def
    if server_def is None:
        return None
    return server_def.job_name, server_def.task_index


def _IsLocal(spec: tf.DeviceSpec) -> bool:
    """Whether a device spec names this process (no job, 'localhost', or its own task)."""
    if spec.job is None or spec.job == "localhost":
        return True
    return (spec.job, spec.task or 0) == _LocalTask()


def _ShortName(full_name: str) -> str:
    spec = tf.DeviceSpec.from_string(full_name)
    return f"/device:{spec.device_type}:{spec.device_index}"


def _DeviceType(short_name: str) -> str:
    return tf.DeviceSpec.from_string(short_name).device_type

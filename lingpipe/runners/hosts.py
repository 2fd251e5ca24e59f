"""Pipeline stages on other hosts, over TensorFlow's distributed runtime (`--strategy=hosts`).

The trainer is the cluster's client and `chief`; each stage host runs
`python -m lingpipe.worker` as one `worker` task of the same TF_CONFIG:

    TF_CONFIG='{"cluster": {"chief": ["10.0.0.1:2222"],
                            "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]},
                "task": {"type": "chief", "index": 0}}'

`Connect` checks that every worker accepts a TCP connection (TensorFlow's own
connect waits forever on a closed port, holding its context), connects with
`tf.config.experimental_connect_to_cluster(..., make_master_device_default=False)`
(ops without a device stay on the client, which reads the data and writes the
checkpoints, summaries and results) and lists each worker's devices.
`StageGroups` places the stages over them in order: worker 0's devices take the
first stages, worker 1's the next, so the only traffic between hosts is at the
stage boundaries where one worker's devices end; devices enough for several
pipelines make several data-parallel replicas (strategies.HostsLayout).
`HostsTrainer` names the worker that went away when a step fails, and the one that
stopped answering when a step misses its deadline (`DEFAULT_STEP_TIMEOUT_S`,
`--step_timeout_s`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from lingpipe import cluster as cluster_lib
from lingpipe.runners import checkpointer, train_loop

__all__ = [
    "Answers",
    "CallWithDeadline",
    "CLIENT_DEVICES",
    "Cluster",
    "Connect",
    "DEFAULT_STEP_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "DescribeStages",
    "GoneWorkers",
    "GradientTraffic",
    "HostsTrainer",
    "HungError",
    "ProbeWorkers",
    "ReadCluster",
    "Responds",
    "StageGroups",
    "Task",
]

DEFAULT_TIMEOUT_S = 60.0
# Seconds a training step may take before the run looks for a worker that stopped
# answering (the run's first step, which traces, gets train_loop.FIRST_STEP_FACTOR times it).
DEFAULT_STEP_TIMEOUT_S = 300.0
# What a gRPC client sends first (HTTP/2's connection preface and an empty SETTINGS
# frame): a live server answers with its own SETTINGS at once.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
# The client's own CPU devices: one per data-parallel replica it runs (the replicas'
# stages live on the workers). The trainer's --logical_devices sets another number.
CLIENT_DEVICES = 8
_T = TypeVar("_T")
_EXAMPLE = (
    'TF_CONFIG=\'{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", '
    '"host2:2222"]}, "task": {"type": "chief", "index": 0}}\''
)
_TASK_IN_ERROR = re.compile(r"/job:worker/replica:\d+/task:(\d+)")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The trainer's address (the chief's) and the workers' addresses, from TF_CONFIG."""

    chief: str
    workers: tuple[str, ...]

    def Spec(self) -> dict[str, list[str]]:
        return {"chief": [self.chief], "worker": list(self.workers)}

    def Name(self, task: int) -> str:
        """'worker 1 (10.0.0.3:2222)'."""
        return f"worker {task} ({self.workers[task]})"


def ReadCluster(raw: str | None) -> Cluster:
    """The cluster of TF_CONFIG, in which this process must be the chief.

    Raises:
      ValueError: TF_CONFIG unset or unreadable, no chief or no workers, or a task
        other than the chief.
    """
    if not raw:
        raise ValueError(
            f"the cluster is read from TF_CONFIG, which is not set; expected {_EXAMPLE}"
        )
    try:
        config = json.loads(raw)
        spec, task = config["cluster"], config.get("task", {"type": "chief", "index": 0})
        chiefs, workers = spec.get("chief", []), spec.get("worker", [])
        task_type, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"TF_CONFIG={raw!r} cannot be read ({type(e).__name__}: {e}); expected {_EXAMPLE}"
        ) from None
    if len(chiefs) != 1 or not workers:
        raise ValueError(
            f"TF_CONFIG={raw!r} has {len(chiefs)} chief(s) and {len(workers)} worker(s); "
            f"expected one chief (this trainer's address) and the stage hosts as workers: "
            f"{_EXAMPLE}"
        )
    if (task_type, index) != ("chief", 0):
        raise ValueError(
            f"in TF_CONFIG={raw!r} this process is task ({task_type!r}, {index}); the trainer "
            'is the chief: "task": {"type": "chief", "index": 0} (the workers run '
            "python -m lingpipe.worker)"
        )
    return Cluster(chief=chiefs[0], workers=tuple(workers))


def Answers(address: str, timeout_s: float) -> str | None:
    """None if something accepts a TCP connection at `address` ('host:port'), else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=max(timeout_s, 0.1)):
            return None
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def Responds(address: str, timeout_s: float) -> bool:
    """Whether the server at `address` answers a gRPC (HTTP/2) greeting within
    `timeout_s`. A stopped or hung process's port still accepts connections (the
    kernel does that), so only an answer tells that it runs."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(_HTTP2_PREFACE)
            return bool(s.recv(9))
    except (OSError, ValueError):
        return False


def ProbeWorkers(cluster: Cluster, timeout_s: float) -> None:
    """Waits up to `timeout_s` for every worker to accept a TCP connection.

    Raises:
      ValueError: naming the first worker that did not answer in time, and why.
    """
    deadline = time.monotonic() + timeout_s
    for task, address in enumerate(cluster.workers):
        while (reason := Answers(address, min(2.0, deadline - time.monotonic()))) is not None:
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"{cluster.Name(task)} does not answer ({reason}) after {timeout_s:g} s; "
                    "start it there with TF_CONFIG naming it as worker "
                    f"{task}: python -m lingpipe.worker, or fix its address in TF_CONFIG"
                )
            time.sleep(0.2)


def CallWithDeadline(fn: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """fn() in a thread; raises ValueError naming `what` when it does not return in time."""
    box: dict = {}

    def Call() -> None:
        try:
            box["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=Call, daemon=True, name=what)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ValueError(f"{what} did not finish within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def Connect(cluster: Cluster, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[int, list[str]]:
    """Connects this process to `cluster` as its chief; returns {worker: its devices}.

    Raises:
      ValueError: a worker that does not answer, a failed connection, or a worker
        that offers no device, each named with its address.
    """
    import tensorflow as tf

    deadline = time.monotonic() + timeout_s
    ProbeWorkers(cluster, timeout_s)

    def ConnectAndList() -> dict[int, list[str]]:
        # Passing the job is needed: from a resolver TensorFlow takes job 'localhost',
        # which with a 'chief' in the cluster waits forever.
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec(cluster.Spec()),
            job_name="chief",
            task_index=0,
            make_master_device_default=False,
        )
        return cluster_lib.TaskDevices("worker")

    what = f"connecting to the cluster as chief {cluster.chief}"
    try:
        devices = CallWithDeadline(ConnectAndList, max(deadline - time.monotonic(), 1.0), what)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ValueError(f"{what} failed: {type(e).__name__}: {reason}") from None
    missing = [t for t in range(len(cluster.workers)) if not devices.get(t)]
    if missing:
        raise ValueError(
            f"{cluster.Name(missing[0])} offers no device; expected each worker to list its "
            f"devices once connected (found {devices})"
        )
    return devices


def StageGroups(task_devices: dict[int, list[str]], num_stages: int) -> list[list[str]]:
    """Stage devices of each replica: the workers' devices in order, `num_stages` a group.

    Each worker offers its accelerators when it has any, else its CPU devices; a
    worker's devices fill consecutive stages. Devices left after the last full
    group stay idle.

    Raises:
      ValueError: fewer devices over all workers than `num_stages`.
    """
    ordered = []
    for task in sorted(task_devices):
        names = task_devices[task]
        accelerators = [d for d in names if "/device:CPU:" not in d]
        ordered.extend(accelerators or names)
    if num_stages > len(ordered):
        raise ValueError(
            f"{num_stages} stages need {num_stages} devices, but the {len(task_devices)} "
            f"worker(s) offer {len(ordered)}: {ordered}; lower --num_stages or start the "
            "workers with more --logical_devices"
        )
    return [
        ordered[r * num_stages : (r + 1) * num_stages] for r in range(len(ordered) // num_stages)
    ]


def DescribeStages(groups: Sequence[Sequence[str]], cluster: Cluster) -> str:
    """'replica 0: stage 0 on worker 0 (host:port) /device:CPU:0' lines."""
    lines = []
    for r, group in enumerate(groups):
        for k, device in enumerate(group):
            task = Task(device)
            host = cluster.Name(task) if task is not None else "this host"
            lines.append(f"replica {r}: stage {k} on {host} /{device.rsplit('/', 1)[-1]}")
    return "\n".join(lines)


def Task(device: str) -> int | None:
    """The worker task of a full device name; None for this process's devices."""
    match = _TASK_IN_ERROR.search(device)
    return int(match.group(1)) if match else None


def GradientTraffic(copies: Sequence[Sequence[tuple[str, int]]]) -> int:
    """Bytes per step that averaging the gradients moves between hosts.

    copies[r][i] is (device, bytes) of weight i in replica r's copy of the task.
    Each gradient is averaged where replica 0's copy lives
    (train_loop.ReduceOnGradientDevices): a replica whose copy is on another host
    sends its gradient there and receives the mean back.
    """
    total = 0
    for copy in copies[1:]:
        for (device, size), (home, _) in zip(copy, copies[0]):
            if cluster_lib.HostOf(device) != cluster_lib.HostOf(home):
                total += 2 * size
    return total


def GoneWorkers(cluster: Cluster, error_text: str, timeout_s: float = 2.0) -> list[int]:
    """Workers that no longer accept connections, else those the error names."""
    gone = [t for t, a in enumerate(cluster.workers) if Answers(a, timeout_s) is not None]
    if gone:
        return gone
    return sorted({int(t) for t in _TASK_IN_ERROR.findall(error_text)})


def HungError(
    cluster: Cluster, work: str, timeout_s: float, latest: str | None
) -> train_loop.StepHungError:
    """train_loop.HungError naming the workers that no longer answer (a stopped or hung
    process: its port still accepts connections, so each is sent a gRPC greeting)."""
    silent = [t for t, a in enumerate(cluster.workers) if not Responds(a, 5.0)]
    if not silent:
        return train_loop.HungError(work, timeout_s, latest)
    who = ", ".join(cluster.Name(t) for t in silent)
    verb = "does" if len(silent) == 1 else "do"
    return train_loop.StepHungError(
        f"{work} did not finish within {timeout_s:g} s (--step_timeout_s): {who} {verb} not "
        f"answer (stopped or hung). The checkpoints are intact (latest: {latest}); restart "
        "the worker (python -m lingpipe.worker) and rerun the trainer with the same command "
        "to resume from it."
    )


class HostsTrainer(train_loop.Trainer):
    """The train loop of a pipeline over the workers of `cluster` (see train_loop.Trainer).

    A step that fails because a worker went away raises ClusterError in one line
    naming the worker, its address and the step.
    """

    def __init__(self, *args, cluster: Cluster, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cluster = cluster
        self.SetStepTimeout(DEFAULT_STEP_TIMEOUT_S)

    def _StepHung(self, work: str, timeout_s: float) -> train_loop.StepHungError:
        return HungError(self._cluster, work, timeout_s, self.checkpointer.latest)

    def _RunStep(self, iterator, step: int, stop: bool) -> train_loop.StepResult:
        try:
            return super()._RunStep(iterator, step, stop)
        except train_loop.StepHungError:
            raise  # It names the workers that stopped answering already.
        except train_loop.ClusterError as e:
            cause = e.__context__
            text = getattr(cause, "message", str(cause or e))
            gone = GoneWorkers(self._cluster, text)
            kind = type(cause).__name__ if cause is not None else "error"
            raise self._Gone(step, gone, kind) from None

    def _Save(self, step: int) -> None:
        """A save reads every stage's variables from its worker: one that died during
        it is named as in a step, not reported as a checkpoint that cannot be written.

        TensorFlow records a checkpoint in its state file and then waits for the
        cluster's pending ops; a worker lost in that wait fails a save whose checkpoint
        is whole, and the error says that step was saved."""
        try:
            super()._Save(step)
        except checkpointer.CheckpointError:
            gone = [t for t, a in enumerate(self._cluster.workers) if Answers(a, 2.0) is not None]
            if not gone:
                raise
            latest = self.checkpointer.latest or ""
            if latest.endswith(f"ckpt-{step}"):
                raise self._Gone(step, gone, "lost as its save finished", saved=True) from None
            raise self._Gone(step, gone, "lost while saving its checkpoint") from None

    def _Gone(
        self, step: int, gone: list[int], kind: str, saved: bool = False
    ) -> train_loop.ClusterError:
        who = ", ".join(self._cluster.Name(t) for t in gone) or "a worker"
        what = f"After step {step} was saved" if saved else f"Step {step} failed"
        return train_loop.ClusterError(
            f"{what}: {who} is gone or unreachable ({kind}). The checkpoints "
            f"are intact (latest: {self.checkpointer.latest}); restart the worker "
            "(python -m lingpipe.worker) and rerun the trainer with the same command to "
            "resume from it."
        )

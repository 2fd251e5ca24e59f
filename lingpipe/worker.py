"""A TensorFlow server for one task of a cluster: the host of some pipeline stages.

    TF_CONFIG='{"cluster": {"chief": ["10.0.0.1:2222"],
                            "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]},
                "task": {"type": "worker", "index": 0}}' \\
      python -m lingpipe.worker --logical_devices=4

(also installed as the `lingpipe-worker` command). The worker serves its task's
address from TF_CONFIG and offers its accelerators, or its CPU split into
`--logical_devices` devices, to the trainer (`--strategy=hosts`), which connects
as the cluster's `chief`, places variables and stages on the workers' devices and
runs the steps. The worker prints one line per device it offers and then waits
until it is stopped: SIGTERM or SIGINT exit with status 0, after a line with the
most memory its devices held since it started (each GPU's allocator, or the CPU's
one allocator): the peak of each stage that this host ran, where the trainer
(whose own devices share no allocator with it) cannot read it. It keeps no state
of its own; the trainer writes the checkpoints, so a worker restarted on the same
address serves a resumed run.

With `--profiler_port=N` it also serves TensorFlow's profiler on that port, so that
another process can trace what this host runs and allocates (the trainer's own
profile sees only its own process):

    tf.profiler.experimental.client.trace("grpc://HOST:N", logdir, duration_ms=2000)

bench/plan_hosts.py --allocations reads each worker's allocations so
(lingpipe.pipeline.observe.allocations).

Exit status: 0 stopped by SIGTERM or SIGINT, 2 bad TF_CONFIG or flags, 1 the
server or its profiler could not start (its address or the profiler's port is in
use, say).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lingpipe.runners import stop_signals

__all__ = [
    "ReadTask",
    "Run",
    "WorkerError",
    "main",
]

_PROG = "lingpipe.worker"
_EXAMPLE = (
    'TF_CONFIG=\'{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, '
    '"task": {"type": "worker", "index": 0}}\''
)


class WorkerError(ValueError):
    """A TF_CONFIG or flag the user must fix; the message says what was expected."""


def ReadTask(raw: str | None) -> tuple[dict, str, int]:
    """(cluster, task type, task index) of TF_CONFIG, checked.

    Raises:
      WorkerError: TF_CONFIG unset, not JSON, or its task not one of its cluster's.
    """
    if not raw:
        raise WorkerError(f"TF_CONFIG is not set; expected e.g. {_EXAMPLE}")
    try:
        config = json.loads(raw)
        cluster, task = config["cluster"], config["task"]
        task_type, index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise WorkerError(
            f"TF_CONFIG={raw!r} cannot be read ({type(e).__name__}: {e}); expected {_EXAMPLE}"
        ) from None
    tasks = cluster.get(task_type) if isinstance(cluster, dict) else None
    if not isinstance(tasks, list) or not 0 <= index < len(tasks):
        raise WorkerError(
            f"in TF_CONFIG={raw!r} the task ({task_type!r}, {index}) is not in the cluster "
            f"(its {task_type!r} job has {len(tasks) if isinstance(tasks, list) else 0} "
            f"task(s)); expected {_EXAMPLE}"
        )
    if task_type == "chief":
        raise WorkerError(
            f"in TF_CONFIG={raw!r} the task is the chief, which is the trainer "
            "(python -m lingpipe.trainer --strategy=hosts); give each worker a "
            '"task": {"type": "worker", "index": i}'
        )
    return cluster, task_type, index


def _OfferedDevices(task_type: str, index: int, num_cpus: int, num_gpus: int) -> list[str]:
    """Full names of the devices the server offers, accelerators first."""
    prefix = f"/job:{task_type}/replica:0/task:{index}"
    gpus = [f"{prefix}/device:GPU:{i}" for i in range(num_gpus)]
    return gpus + [f"{prefix}/device:CPU:{i}" for i in range(num_cpus)]


def _StartServer(
    cluster: dict, task_type: str, index: int, logical_devices: int, intra: int = 0, inter: int = 0
):
    """Starts the task's `tf.distribute.Server` (`intra`, `inter`: its op threads, 0:
    TensorFlow's default); returns (server, offered device names)."""
    import tensorflow as tf

    num_cpus = max(logical_devices, 1)
    config = tf.compat.v1.ConfigProto(
        device_count={"CPU": num_cpus},
        intra_op_parallelism_threads=intra,
        inter_op_parallelism_threads=inter,
    )
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=task_type,
        task_index=index,
        protocol="grpc",
        config=config,
        start=True,
    )
    return server, _OfferedDevices(task_type, index, num_cpus, num_gpus)


def _PortInUse(port: int) -> str:
    """Why this host cannot listen on `port` (every interface), or '' where it can."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            return f"{type(e).__name__}: {e.strerror or e}"
    return ""


def PeakLine(devices: list[str]) -> str:
    """`peak memory: CPU (one allocator) 12.5 MiB (13107200 bytes)`: the most each
    allocator of `devices` (the offered ones: the GPUs' where there are any, else the
    CPU's) held since the process started; a line saying why where it cannot be read."""
    from lingpipe.pipeline.observe import memory

    gpus = [d for d in devices if "/device:GPU:" in d]
    local = [d.split("/device:")[1] for d in gpus or devices[:1]]
    try:
        peaks = memory.MeasuredPeaks([f"/device:{d}" for d in local])
    except Exception as e:  # noqa: BLE001 - an allocator without statistics
        return f"peak memory: not known ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    parts = [
        f"{'CPU (one allocator)' if key.startswith('all CPU') else key.strip('/')} "
        f"{b / 2**20:.1f} MiB ({b} bytes)"
        for key, b in peaks.items()
    ]
    return "peak memory: " + ", ".join(parts)


def _Flags(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=_PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--logical_devices",
        type=int,
        default=0,
        help="Split this host's CPU into this many devices for stages (0: one CPU device). "
        "GPUs, when present, are offered as they are.",
    )
    for name in ("intra_op_threads", "inter_op_threads"):
        parser.add_argument(
            f"--{name}",
            type=int,
            default=0,
            help=f"TensorFlow {name.split('_')[0]}-op threads of this host (0: TF's default).",
        )
    parser.add_argument(
        "--profiler_port",
        type=int,
        default=0,
        help="Serve TensorFlow's profiler on this port (0: do not), for "
        "tf.profiler.experimental.client.trace from another process.",
    )
    flags = parser.parse_args(argv)
    if not 0 <= flags.profiler_port <= 65535:
        parser.error(
            f"--profiler_port: expected a port in [1, 65535], or 0 for none, "
            f"received {flags.profiler_port}"
        )
    if not 0 <= flags.logical_devices <= 64:
        parser.error(
            f"--logical_devices: expected an integer in [0, 64], received {flags.logical_devices}"
        )
    for name in ("intra_op_threads", "inter_op_threads"):
        if getattr(flags, name) < 0:
            parser.error(
                f"--{name}: expected an integer >= 0 (0: TensorFlow's default), "
                f"received {getattr(flags, name)}"
            )
    return flags


def main(argv: list[str] | None = None) -> int:
    flags = _Flags(sys.argv[1:] if argv is None else argv)
    try:
        cluster, task_type, index = ReadTask(os.environ.get("TF_CONFIG"))
    except WorkerError as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    address = cluster[task_type][index]
    # TensorFlow's profiler server logs a port it cannot bind and carries on without
    # serving: the port is tried first, before anything starts (a process that takes it
    # between this try and TensorFlow's bind is not caught).
    busy = _PortInUse(flags.profiler_port) if flags.profiler_port else ""
    if busy:
        print(
            f"{_PROG}: error: cannot serve the profiler on port {flags.profiler_port}: {busy}",
            file=sys.stderr,
        )
        return 1
    # Every allocation counted in the CPU allocator's peak (cluster.SetLogicalCpuDevices
    # says why), as the trainer's own devices count them.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    from lingpipe import tf_logs

    tf_logs.ImportTensorFlow()  # no banner; C++ INFO lines (session options) off
    try:
        _, devices = _StartServer(
            cluster,
            task_type,
            index,
            flags.logical_devices,
            flags.intra_op_threads,
            flags.inter_op_threads,
        )
    except Exception as e:  # noqa: BLE001 - TensorFlow raises several kinds here
        reason = " ".join(str(e).split())[:300]
        print(
            f"{_PROG}: error: cannot serve {address}: {type(e).__name__}: {reason}", file=sys.stderr
        )
        return 1
    if flags.profiler_port:
        import tensorflow as tf

        tf.profiler.experimental.server.start(flags.profiler_port)
    # Caught before it says it is ready: a stop sent on 'ready' must not meet the
    # default action, which ends the process without a word.
    with stop_signals.StopSignals() as stop:
        print(f"{_PROG}: serving {task_type} {index} at {address} with {len(devices)} device(s):")
        for d in devices:
            print(f"  {d}")
        if flags.profiler_port:
            print(f"{_PROG}: profiler on port {flags.profiler_port}")
        print(f"{_PROG}: ready", flush=True)
        # A timed wait, so that the handler runs (Python runs handlers between bytecodes;
        # the server's own join() would hold the main thread in C++ for good).
        while stop.received is None:
            time.sleep(0.2)
    name = stop.received
    print(f"{_PROG}: stopped by {name}; {PeakLine(devices)}", flush=True)
    # The server has no clean shutdown; its threads would keep a normal exit waiting.
    os._exit(0)


def Run() -> None:
    """Entry point of `python -m lingpipe.worker` and the `lingpipe-worker` command."""
    sys.exit(main())


if __name__ == "__main__":
    Run()

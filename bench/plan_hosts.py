"""The memory estimate per device against each device's own allocator (issue 29's
"Measure the peak per device where each device has an allocator of its own").

    python bench/plan_hosts.py                  # bench/results/plan_hosts.json
    python bench/plan_hosts.py --models=mlp --micro_batches=4

On one process the two logical CPU devices share one allocator, so bench/plan.py can
only compare the step's total. Here every stage runs in a process of its own: per
configuration, two `python -m lingpipe.worker --logical_devices=1` on loopback, and a
chief (the --strategy=hosts way: hosts.Connect) that builds bench/plan.py's Adam step
of the configuration with replica r's stages on the workers' devices, and runs 2
steps and then 5 more. Each worker, stopped, prints the most its allocator held since
it started (lingpipe.worker.PeakLine): its stage's weights, Adam's slots, activations
and gradients, and the tensors that crossed to it. Against it, the estimate of that
device (memory.DeviceMemory, what the planner caps), its partition the one the
grid's row of the same configuration ran (bench/results/plan.json). The workers run
`--worker_threads` (intra-op, inter-op; default TensorFlow's own); the grid's one
process runs 1 and 2 for both devices.

A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from bench import common  # noqa: E402

RESULTS = os.path.join(HERE, "results")
WORKER = "/job:worker/replica:0/task:{}/device:CPU:0"
DEADLINE_S = 600
# The grid's configurations measured here: every schedule, at one and at many
# micro-batches, without and with recompute.
DEFAULT = dict(models=("lm32k", "mlp"), micro_batches=(1, 8), remats=("never", "always"))


def _FreePorts(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _TfConfig(spec: dict, task: str, index: int) -> str:
    return json.dumps({"cluster": spec, "task": {"type": task, "index": index}})


def Chief(model: str, row: dict, steps: int) -> dict:
    """In the chief's process: the row's configuration over the workers; its estimate
    per device and the median step."""
    from bench import plan
    from lingpipe.runners import hosts

    hosts.Connect(hosts.ReadCluster(os.environ["TF_CONFIG"]))
    import tensorflow as tf

    pipe_p, inputs, loss_fn = plan.Model(model)
    batch = tf.nest.flatten(inputs)[0].shape[0]
    c = next(
        g for g in plan.Grid(dict(schedules=None, remats=plan.REMATS, micro_batches=[row["M"]]),
                             len(pipe_p.cell_tpl), batch)
        if (g.replicas, g.num_stages, g.schedule, g.num_virtual_stages, g.remat)
        == (row["R"], row["K"], row["schedule"], row["v"], row["remat"])
    )  # fmt: skip
    c.partition, c.partition_policy = tuple(row["cells"]), row["partition"]
    first, _, others = plan.EstimateDevices(pipe_p, inputs, c, {})
    devices = [WORKER.format(i) for i in range(2)]
    step, _ = plan.BuildStep(pipe_p, inputs, loss_fn, c, devices)
    seconds, _, _ = plan.Measure(step, steps)
    # R replicas of K stages: device d of replica r is worker r * K + d.
    estimate = first + others * (c.replicas - 1)
    return dict(estimate=estimate, step_s=seconds)


def _Peak(log: str) -> int | None:
    for line in reversed(log.splitlines()):
        if "peak memory: CPU (one allocator)" in line:
            return int(line.rsplit("(", 1)[1].split()[0])
    return None


def Measure(model: str, row: dict, steps: int, threads: tuple[int, int] = (0, 0)) -> dict:
    """One configuration: two workers (`threads`: their intra- and inter-op threads),
    the chief, the workers stopped and read."""
    ports = _FreePorts(3)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), env.get("PYTHONPATH")) if p
    )
    with tempfile.TemporaryDirectory() as logdir:
        logs = [os.path.join(logdir, f"worker{i}.log") for i in range(2)]
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "lingpipe.worker", "--logical_devices=1",
                 f"--intra_op_threads={threads[0]}", f"--inter_op_threads={threads[1]}"],
                stdout=open(log, "w"), stderr=subprocess.STDOUT,
                env=dict(env, TF_CONFIG=_TfConfig(spec, "worker", i)),
            )
            for i, log in enumerate(logs)
        ]  # fmt: skip
        job = json.dumps(dict(model=model, row=row, steps=steps))
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--chief", job],
                capture_output=True, text=True, timeout=DEADLINE_S,
                env=dict(env, TF_CONFIG=_TfConfig(spec, "chief", 0)),
            )  # fmt: skip
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(timeout=60)
        peaks = [_Peak(open(log).read()) for log in logs]
    if done.returncode != 0:
        return dict(error=done.stderr.strip().splitlines()[-1][:300])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), measured=peaks)


def Rows(model: str, grid_rows: list, args) -> list:
    out = []
    for r in grid_rows:
        if r["model"] != model or r["M"] not in args.micro_batches or r["remat"] not in args.remats:
            continue
        if r["partition"] != "flops" or (args.schedules and r["schedule"] not in args.schedules):
            continue
        found = Measure(model, r, args.steps, args.worker_threads)
        row = dict(model=model, R=r["R"], K=r["K"], M=r["M"], schedule=r["schedule"], v=r["v"])
        row.update(remat=r["remat"], cells=r["cells"])
        if "error" in found:
            row["error"] = found["error"]
        else:
            est = [b / 2**20 for b in found["estimate"]]
            got = [b / 2**20 if b is not None else None for b in found["measured"]]
            row.update(
                estimate_mib=[round(e, 1) for e in est],
                measured_mib=[round(g, 1) if g is not None else None for g in got],
                memory_err=[round(e / g - 1, 4) if g else None for e, g in zip(est, got)],
                step_s=found["step_s"],
                one_process_err=r.get("memory_err"),
            )
        print(json.dumps(row), file=sys.stderr, flush=True)
        out.append(row)
    return out


def Summary(rows: list) -> list:
    """Per model and all: the error per device, median of |err|, the worst, the most below."""
    out = []
    for scope in sorted({r["model"] for r in rows}) + ["all"]:
        errs = [e for r in rows if scope in ("all", r["model"]) for e in r.get("memory_err", [])
                if e is not None]  # fmt: skip
        if not errs:
            continue
        out.append(
            dict(
                scope=scope, devices=len(errs),
                memory_median=round(statistics.median(abs(e) for e in errs), 4),
                memory_worst=round(max(errs, key=abs), 4),
                memory_most_below=round(min(errs), 4),
                within_10_below=sum(e >= -0.10 for e in errs),
            )
        )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chief", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--models", default=",".join(DEFAULT["models"]))
    ap.add_argument("--micro_batches", default=",".join(map(str, DEFAULT["micro_batches"])))
    ap.add_argument("--remats", default=",".join(DEFAULT["remats"]))
    ap.add_argument("--schedules", default="", help="default: every one the grid ran")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--worker_threads", default="0,0", help="each worker's intra,inter-op threads (0: TF's)"
    )
    ap.add_argument("--grid", default=os.path.join(RESULTS, "plan.json"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "plan_hosts.json"))
    args = ap.parse_args(argv)
    if args.chief:
        job = json.loads(args.chief)
        print(json.dumps(Chief(job["model"], job["row"], job["steps"])))
        return 0
    args.micro_batches = [int(m) for m in args.micro_batches.split(",")]
    args.worker_threads = tuple(int(t) for t in args.worker_threads.split(","))
    args.remats = args.remats.split(",")
    args.schedules = [s for s in args.schedules.split(",") if s]
    grid = json.load(open(args.grid))
    start = time.perf_counter()
    rows = [row for m in args.models.split(",") for row in Rows(m, grid["rows"], args)]
    payload = dict(
        date=datetime.date.today().isoformat(),
        machine=common.Machine(),
        grid=os.path.relpath(args.grid, os.path.dirname(HERE)),
        grid_date=grid.get("date"),
        seconds=round(time.perf_counter() - start, 1),
        worker_threads=dict(zip(("intra_op", "inter_op"), args.worker_threads)),
        notes=[
            "Each row: two worker processes (one CPU device each, TensorFlow's default "
            "threads) and a chief; per device, the estimate (memory.DeviceMemory) against "
            "the peak its worker's allocator held since it started, and memory_err = "
            "estimate / measured - 1. one_process_err: the grid's row (both devices in "
            "one allocator, the total against memory.HostMemory).",
        ],
        rows=rows,
        summary_rows=Summary(rows),
    )
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    for s in payload["summary_rows"]:
        print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())

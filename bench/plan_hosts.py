"""The memory estimate per device against each device's own allocator (issue 29's
"Measure the peak per device where each device has an allocator of its own").

    python bench/plan_hosts.py                  # bench/results/plan_hosts.json
    python bench/plan_hosts.py --models=mlp --micro_batches=4
    python bench/plan_hosts.py --reestimate     # today's estimate of the committed rows

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

With --allocations each worker also serves TensorFlow's profiler (lingpipe.worker
--profiler_port) and the chief traces both workers from before it builds the
configuration through its first steps (steps run until the traces end; the timed
steps come after, untraced): per device the most that the tensors in its allocator
asked for at once (`requested_mib`) and, at the trace's peak, what the chunks held
beyond the requests (`slack_mib`: TensorFlow's BFC allocator serves a request from a
free chunk and splits the chunk only when it is at least twice the request), beside
the estimate (`tensors_err` = estimate / requested - 1).

A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
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


def Chief(
    model: str, row: dict, steps: int, profilers: list | None = None, trace_s: float = 0.0
) -> dict:
    """In the chief's process: the row's configuration over the workers; its estimate
    per device and the median step; with `profilers` (each worker's profiler address),
    what each worker's allocator held while more steps ran (TraceWorkers)."""
    from bench import plan
    from lingpipe.runners import hosts

    hosts.Connect(hosts.ReadCluster(os.environ["TF_CONFIG"]))

    pipe_p, inputs, loss_fn = plan.Model(model)
    c = _Candidate(pipe_p, inputs, row)
    estimate = _Estimate(pipe_p, inputs, c, {})
    devices = [WORKER.format(i) for i in range(2)]
    # The traces start before the build: every allocation of the run is in them.
    traced = _StartTraces(profilers, trace_s) if profilers else None
    start = time.perf_counter()
    step, _ = plan.BuildStep(pipe_p, inputs, loss_fn, c, devices)
    out: dict = {"build_s": time.perf_counter() - start}  # the step is traced at its first call
    if traced:
        out["allocations"] = _ReadTraces(step, *traced)
    seconds, _, _ = plan.Measure(step, steps)
    out.update(estimate=estimate, step_s=seconds)
    return out


def _Candidate(pipe_p, inputs, row: dict):
    """The planner's candidate of the row's configuration, its partition the row's."""
    import tensorflow as tf

    from bench import plan

    batch = tf.nest.flatten(inputs)[0].shape[0]
    c = next(
        g for g in plan.Grid(dict(schedules=None, remats=plan.REMATS, micro_batches=[row["M"]]),
                             len(pipe_p.cell_tpl), batch)
        if (g.replicas, g.num_stages, g.schedule, g.num_virtual_stages, g.remat)
        == (row["R"], row["K"], row["schedule"], row["v"], row["remat"])
    )  # fmt: skip
    c.partition, c.partition_policy = tuple(row["cells"]), row.get("partition", "flops")
    return c


def _Estimate(pipe_p, inputs, c, traced_cache: dict) -> list:
    """Bytes per worker: R replicas of K stages, device d of replica r on worker r * K + d
    (replica 0's devices also receive the other replicas' gradients)."""
    from bench import plan

    first, _, others = plan.EstimateDevices(pipe_p, inputs, c, traced_cache)
    return first + others * (c.replicas - 1)


def Reestimate(path: str) -> dict:
    """The committed rows of `path` with the estimate of today's code: estimate_mib,
    memory_err and tensors_err again, the measurements as they were (the estimate is
    computed from the model and the configuration alone, no worker runs). A changed
    row's errors are taken against its measurements as recorded (to 0.1 MiB)."""
    from bench import plan

    payload = json.load(open(path))
    models: dict = {}
    for row in payload["rows"]:
        if "estimate_mib" not in row:
            continue
        if row["model"] not in models:
            pipe_p, inputs, _ = plan.Model(row["model"])
            models[row["model"]] = (pipe_p, inputs, {})
        pipe_p, inputs, cache = models[row["model"]]
        est = [b / 2**20 for b in _Estimate(pipe_p, inputs, _Candidate(pipe_p, inputs, row), cache)]
        if [round(e, 1) for e in est] == row["estimate_mib"]:
            continue  # its errors stay those taken against the unrounded measurements
        got = row["measured_mib"]
        row["estimate_mib"] = [round(e, 1) for e in est]
        row["memory_err"] = [round(e / g - 1, 4) if g else None for e, g in zip(est, got)]
        if "requested_mib" in row:
            row["tensors_err"] = [round(e / b - 1, 4) for e, b in zip(est, row["requested_mib"])]
    payload["summary_rows"] = Summary(payload["rows"])
    payload["estimated"] = datetime.date.today().isoformat()
    note = "--reestimate: estimate_mib, memory_err and tensors_err recomputed on "
    payload["notes"] = [n for n in payload["notes"] if not n.startswith(note)]
    payload["notes"].append(
        f"{note}{payload['estimated']} by the code of that day; the measurements are the "
        f"run's of {payload['date']}."
    )
    return payload


# Seconds each worker is traced for at first beyond two of the grid's step times per
# step; a configuration whose build and first step (which traces and instantiates the
# step's functions) outlast it is measured again with the time they took (Measure).
TRACE_S = 4.0
MIN_TRACED_STEPS = 2


def _StartTraces(profilers: list, seconds: float) -> tuple:
    """One thread per worker tracing its profiler for `seconds`: (threads, logdir, start)."""
    import threading

    import tensorflow as tf

    logdir = tempfile.mkdtemp()
    threads = [
        threading.Thread(
            target=tf.profiler.experimental.client.trace,
            args=(address, os.path.join(logdir, str(i)), int(seconds * 1000)),
        )
        for i, address in enumerate(profilers)
    ]
    for t in threads:
        t.start()
    return threads, logdir, time.perf_counter()


def _ReadTraces(step, threads: list, logdir: str, start: float) -> list | dict:
    """Steps run for as long as any trace lasts; then per worker [peak bytes, requested
    bytes, slack bytes] of its allocator (allocations.Peaks); or, where fewer than
    MIN_TRACED_STEPS steps ended inside the traces, {"needs_s": the seconds from the
    traces' start to the end of the first step}."""
    from lingpipe.pipeline.observe import allocations, timeline

    try:
        inside, first_end = 0, None
        while any(t.is_alive() for t in threads):
            step().numpy()
            first_end = first_end or time.perf_counter() - start
            inside += all(t.is_alive() for t in threads)
        for t in threads:
            t.join()
        if inside < MIN_TRACED_STEPS:
            return {"needs_s": first_end or time.perf_counter() - start}
        out = []
        for i in range(len(threads)):
            space = timeline.ReadXSpace(timeline.LatestProfile(os.path.join(logdir, str(i))))
            peaks = allocations.Peaks(space)
            p = max(peaks.values(), key=lambda a: a.peak_bytes)  # the worker's one allocator
            out.append([p.peak_bytes, p.requested_bytes, p.slack_bytes])
        return out
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _Peak(log: str) -> int | None:
    for line in reversed(log.splitlines()):
        if "peak memory: CPU (one allocator)" in line:
            return int(line.rsplit("(", 1)[1].split()[0])
    return None


def Measure(
    model: str,
    row: dict,
    steps: int,
    threads: tuple[int, int] = (0, 0),
    traced: bool = False,
    trace_s: float = 0.0,
) -> dict:
    """One configuration: two workers (`threads`: their intra- and inter-op threads),
    the chief, the workers stopped and read; `traced`: each worker's allocations traced
    too (module doc), for `trace_s` (default TRACE_S and two grid steps per step), once
    more for longer where the first step outlasted it."""
    window = trace_s or TRACE_S + 2 * steps * row["measured_s"]
    ports = _FreePorts(5)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:3]]}
    profiler_ports = ports[3:] if traced else []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), env.get("PYTHONPATH")) if p
    )
    with tempfile.TemporaryDirectory() as logdir:
        logs = [os.path.join(logdir, f"worker{i}.log") for i in range(2)]
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "lingpipe.worker", "--logical_devices=1",
                 f"--intra_op_threads={threads[0]}", f"--inter_op_threads={threads[1]}"]
                + [f"--profiler_port={p}" for p in profiler_ports[i : i + 1]],
                stdout=open(log, "w"), stderr=subprocess.STDOUT,
                env=dict(env, TF_CONFIG=_TfConfig(spec, "worker", i)),
            )
            for i, log in enumerate(logs)
        ]  # fmt: skip
        profilers = [f"grpc://127.0.0.1:{p}" for p in profiler_ports]
        job = json.dumps(
            dict(model=model, row=row, steps=steps, profilers=profilers, trace_s=window)
        )
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
    found = dict(json.loads(done.stdout.strip().splitlines()[-1]), measured=peaks)
    needs = found.get("allocations", {})
    if isinstance(needs, dict) and not trace_s:
        longer = needs["needs_s"] + 2 * steps * found["step_s"] + TRACE_S
        return Measure(model, row, steps, threads, traced, longer)
    if isinstance(needs, dict):
        found["allocations"] = f"fewer than {MIN_TRACED_STEPS} steps in a {window:.0f} s trace"
    return found


def Rows(model: str, grid_rows: list, args) -> list:
    out = []
    for r in grid_rows:
        if r["model"] != model or r["M"] not in args.micro_batches or r["remat"] not in args.remats:
            continue
        if r["partition"] != "flops" or (args.schedules and r["schedule"] not in args.schedules):
            continue
        found = Measure(model, r, args.steps, args.worker_threads, args.allocations)
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
            if isinstance(found.get("allocations"), str):
                row["allocations_error"] = found["allocations"]
            elif "allocations" in found:
                peak, requested, slack = zip(*found["allocations"])
                row.update(
                    requested_mib=[round(b / 2**20, 1) for b in requested],
                    slack_mib=[round(b / 2**20, 1) for b in slack],
                    trace_peak_mib=[round(b / 2**20, 1) for b in peak],
                    tensors_err=[round(e / (b / 2**20) - 1, 4) for e, b in zip(est, requested)],
                    build_s=round(found["build_s"], 1),
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
        tensors = [e for r in rows if scope in ("all", r["model"])
                   for e in r.get("tensors_err", [])]  # fmt: skip
        if tensors:
            out[-1].update(
                tensors_median=round(statistics.median(abs(e) for e in tensors), 4),
                tensors_most_below=round(min(tensors), 4),
                tensors_within_10_below=sum(e >= -0.10 for e in tensors),
            )
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
    ap.add_argument(
        "--allocations",
        action="store_true",
        help="trace each worker's allocations too: what the tensors asked for (module doc)",
    )
    ap.add_argument(
        "--reestimate",
        action="store_true",
        help="only recompute the estimates of the rows in --out (no workers run)",
    )
    ap.add_argument("--grid", default=os.path.join(RESULTS, "plan.json"))
    ap.add_argument("--out", default=os.path.join(RESULTS, "plan_hosts.json"))
    args = ap.parse_args(argv)
    if args.chief:
        job = json.loads(args.chief)
        print(
            json.dumps(
                Chief(job["model"], job["row"], job["steps"], job.get("profilers"), job["trace_s"])
            )
        )
        return 0
    if args.reestimate:
        payload = Reestimate(args.out)
        _Write(payload, args.out)
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
        ]
        + [
            "--allocations: requested_mib, per device the most its tensors asked for at "
            "once, traced from before the build through the first steps; slack_mib, what "
            "the allocator's chunks held beyond the requests at the trace's peak; "
            "trace_peak_mib, the chunks' peak in the trace; tensors_err = estimate / "
            "requested - 1; build_s, the chief's build of the configuration (in the trace)."
        ]
        * args.allocations,
        rows=rows,
        summary_rows=Summary(rows),
    )
    _Write(payload, args.out)
    return 0


def _Write(payload: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    for s in payload["summary_rows"]:
        print(json.dumps(s))


if __name__ == "__main__":
    sys.exit(main())

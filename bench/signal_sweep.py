"""A signal at N points of a short training run: is each answer the one documented?

    python bench/signal_sweep.py                 # SIGTERM and SIGINT at 20 points each
    python bench/signal_sweep.py --points=5 --signals=SIGTERM

Runs `python -m lingpipe.trainer` on lm.TransformerLmTiny for a few steps once without
a signal to time it, then again with the signal sent at evenly spaced delays from
0.1 s to the end of that run, each in a fresh logdir. Each answer is checked against
the exit-status table of `python -m lingpipe.trainer --help` (and README): status 3
and one "Stopped by ..." line from start-up to the last step; status 0 once the final
evaluation runs; Python's own default in its first ~0.15 s; and never a
`lingpipe.lock` left behind. Prints a table and writes bench/results/signal_sweep.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = ["--model=lm.TransformerLmTiny", "--max_steps=40", "--log_interval_steps=10"]


def _Run(logdir: str, signum: int | None, delay: float) -> dict:
    cmd = [sys.executable, "-m", "lingpipe.trainer", f"--logdir={logdir}", *FLAGS]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if signum is not None:
        time.sleep(delay)
        proc.send_signal(signum)
    out, err = proc.communicate(timeout=600)
    lines = [ln for ln in (out + err).decode().splitlines() if ln.strip()]
    mine = [ln for ln in lines if ln.startswith("lingpipe.trainer:")]
    return dict(
        delay_s=round(delay, 2),
        seconds=round(time.perf_counter() - start, 2),
        status=proc.returncode,
        line=(mine or lines or [""])[-1][:110],
        lock_left=os.path.exists(os.path.join(logdir, "lingpipe.lock")),
        traceback=any(ln.startswith("Traceback") for ln in lines),
    )


def Documented(row: dict, signame: str) -> bool:
    """Whether the row is an answer the exit-status table gives."""
    if row["lock_left"]:
        return False
    if row["status"] == 3:
        return row["line"].startswith(f"lingpipe.trainer: Stopped by {signame}")
    if row["status"] == 0:
        return not row["traceback"]  # the final evaluation ran, or the run had ended
    # Python's own start-up, before the trainer's code: its default action.
    return row["delay_s"] <= 0.2 and row["status"] in (-signal.SIGTERM, 1, -signal.SIGINT)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--signals", default="SIGTERM,SIGINT")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = _Run(os.path.join(tmp, "base"), None, 0.0)
        end = base["seconds"]
        print(f"unsignalled run: {end:.1f} s, status {base['status']}", flush=True)
        rows = []
        for name in args.signals.split(","):
            signum = getattr(signal, name)
            for i in range(args.points):
                delay = 0.1 + (end - 0.1) * i / max(args.points - 1, 1)
                row = _Run(os.path.join(tmp, f"{name}{i}"), signum, delay)
                row.update(signal=name, documented=Documented(row, name))
                rows.append(row)
                print(common.Table([row], list(row)), flush=True)
    columns = ["signal", "delay_s", "status", "lock_left", "documented", "line"]
    print(common.Table(rows, columns))
    bad = [r for r in rows if not r["documented"]]
    print(f"{len(rows) - len(bad)} of {len(rows)} answers are the documented ones")
    out = os.path.join(HERE, "results", "signal_sweep.json")
    common.WriteJson(out, {"machine": common.Machine(), "unsignalled_s": end, "rows": rows})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

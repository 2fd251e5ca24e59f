"""Child processes with a time budget, for benchmarks that must end in a set time.

`Child(argv)` starts a process in a process group of its own, its output in files
(a child that prints much never blocks on a full pipe). `Wait(deadline)` collects
every JSON object the child printed, one per line, as it went: a child prints each
row as soon as it has it, so one stopped at its budget keeps the rows it finished.
At the deadline the whole group is killed, the child and whatever it started
(bench/capacity.py's probes), so that nothing outlives its section holding the GPU.

`Script(path, args)` is bench/common.py's RunChild command: `python path --child args`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any


def Script(path: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, path, "--child", *args]


@dataclasses.dataclass
class Outcome:
    """What a child left: its JSON lines, its wall time and, if it ended early, why."""

    lines: list[dict[str, Any]]  # the JSON objects it printed, in order
    seconds: float
    error: str = ""  # one line; '' when it exited 0
    timed_out: bool = False

    def Of(self, kind: str) -> list[dict[str, Any]]:
        """Its lines with {"kind": kind}, without that key."""
        return [
            {k: v for k, v in x.items() if k != "kind"} for x in self.lines if x.get("kind") == kind
        ]


class Child:
    """A process started now; `Wait` ends it by its deadline."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self._out = tempfile.TemporaryFile("w+")
        self._err = tempfile.TemporaryFile("w+")
        self._start = time.monotonic()
        self._proc = subprocess.Popen(
            list(argv), stdout=self._out, stderr=self._err, text=True, env=env,
            start_new_session=True,  # its own process group: killed with all it started
        )  # fmt: skip

    def Done(self) -> bool:
        return self._proc.poll() is not None

    def Kill(self) -> None:
        """Kills the child's process group now (the parent was interrupted)."""
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def Wait(self, deadline: float) -> Outcome:
        """Waits until the child exits or `deadline` (time.monotonic()) passes, then kills
        its process group; returns what it printed."""
        timed_out = False
        try:
            self._proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.Kill()
        seconds = time.monotonic() - self._start
        out, err = (_ReadAndClose(f) for f in (self._out, self._err))
        error = ""
        if timed_out:
            error = f"stopped at its time budget after {seconds:.0f} s"
        elif self._proc.returncode != 0:
            error = f"exit {self._proc.returncode}: {LastLine(err or out)}"
        return Outcome(JsonLines(out), seconds, error, timed_out)


def RunAll(
    argvs: Sequence[Sequence[str]],
    deadline: float,
    parallel: int = 1,
    env: dict[str, str] | None = None,
) -> list[Outcome]:
    """Runs each argv as a Child, `parallel` at a time, all ended by `deadline`; one
    Outcome each, in order (a child not started by the deadline says so)."""
    outcomes: list[Outcome | None] = [None] * len(argvs)
    pending = list(range(len(argvs)))
    running: dict[int, Child] = {}
    try:
        while pending or running:
            while pending and len(running) < max(1, parallel) and time.monotonic() < deadline:
                i = pending.pop(0)
                running[i] = Child(argvs[i], env)
            if not running:
                break
            for i, child in list(running.items()):
                if child.Done() or time.monotonic() >= deadline:
                    outcomes[i] = running.pop(i).Wait(deadline)
            time.sleep(0.05)
    finally:  # interrupted: nothing started here may outlive the parent
        for child in running.values():
            child.Kill()
    for i in pending:
        outcomes[i] = Outcome([], 0.0, "not started: its section's time budget ran out", True)
    return outcomes  # type: ignore[return-value]


_EMIT = threading.Lock()


def Emit(kind: str, **fields: Any) -> None:
    """Prints one JSON line {"kind": kind, **fields} at once, whole even when threads
    emit together (for the parent's Wait)."""
    line = json.dumps({"kind": kind, **fields}, default=str) + "\n"
    with _EMIT:
        sys.stdout.write(line)
        sys.stdout.flush()


def JsonLines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def LastLine(text: str, limit: int = 300) -> str:
    """The last non-empty line of `text` (a traceback's error), at most `limit` characters."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    line = lines[-1] if lines else "(no output)"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _ReadAndClose(f) -> str:
    f.seek(0)
    text = f.read()
    f.close()
    return text

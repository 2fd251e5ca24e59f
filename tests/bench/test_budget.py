"""bench/budget.py: a child's JSON lines survive its budget, and the budget ends the
child's whole process group, what it started included."""

import os
import sys
import textwrap
import time

from bench import budget

# A child that prints a row, starts a grandchild that would outlive it (its pid in a file),
# prints another row, then sleeps past any budget of these tests.
SLOW = textwrap.dedent(
    """
    import json, subprocess, sys, time
    print(json.dumps({"kind": "row", "n": 1}), flush=True)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(sys.argv[1], "w").write(str(grandchild.pid))
    print("not json", flush=True)
    print(json.dumps({"kind": "probe", "n": 2}), flush=True)
    time.sleep(60)
    """
)


def _Alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed grandchild whose parent died is reaped by init; until then it is a zombie.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_a_child_stopped_at_its_budget_keeps_its_lines_and_takes_its_children(tmp_path):
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    child = budget.Child([sys.executable, "-c", SLOW, str(pid_file)])
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.05)
    outcome = child.Wait(time.monotonic() + 0.5)
    assert time.monotonic() - start < 30
    assert outcome.timed_out and outcome.error.startswith("stopped at its time budget after ")
    assert outcome.lines == [{"kind": "row", "n": 1}, {"kind": "probe", "n": 2}]
    assert outcome.Of("row") == [{"n": 1}] and outcome.Of("probe") == [{"n": 2}]
    grandchild = int(pid_file.read_text())
    for _ in range(100):
        if not _Alive(grandchild):
            break
        time.sleep(0.05)
    assert not _Alive(grandchild)


def test_a_failing_child_gives_its_last_line():
    script = "import json; print(json.dumps({'kind': 'row'})); raise ValueError('bad size')"
    (outcome,) = budget.RunAll([[sys.executable, "-c", script]], time.monotonic() + 30)
    assert not outcome.timed_out and outcome.lines == [{"kind": "row"}]
    assert outcome.error == "exit 1: ValueError: bad size"


def test_run_all_keeps_the_order_and_says_what_it_did_not_start():
    argvs = [[sys.executable, "-c", f"print('{{\"n\": {i}}}')"] for i in range(3)]
    outcomes = budget.RunAll(argvs, time.monotonic() + 30, parallel=2)
    assert [o.lines for o in outcomes] == [[{"n": 0}], [{"n": 1}], [{"n": 2}]]
    assert all(not o.error for o in outcomes)
    (late,) = budget.RunAll(argvs[:1], time.monotonic() - 1)
    assert late.error == "not started: its section's time budget ran out" and not late.lines

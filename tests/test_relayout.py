"""tools/relayout.py, run on a clone of this checkout's last commit: done once, a second run
changes nothing; it refuses an engine module it has no destination for; and it rewrites
the old paths of code merged after it ran."""

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _Git(where: pathlib.Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def clone(tmp_path) -> pathlib.Path:
    where = tmp_path / "clone"
    _Git(tmp_path, "clone", "--quiet", "--no-hardlinks", str(REPO), str(where))
    _Git(where, "config", "user.email", "test@example.com")
    _Git(where, "config", "user.name", "test")
    return where


def _Relayout(where: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "tools/relayout.py"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _Commit(where: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    _Git(where, "add", "-A")
    _Git(where, "commit", "-q", "-m", "merged work")


def test_a_second_run_changes_nothing(clone):
    run = _Relayout(clone)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "rewrote 0 files\n"
    assert _Git(clone, "status", "--porcelain") == ""


def test_an_engine_module_without_a_destination_is_refused_before_any_change(clone):
    _Commit(clone, {"lingpipe/pipeline/settings.py": '"""New."""\n'})
    run = _Relayout(clone)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "relayout: lingpipe/pipeline/settings.py: no destination in tools/relayout.py PIPELINE",
        'relayout: add a line for each (e.g. "settings": "step/settings") and run it again',
    ]
    assert _Git(clone, "status", "--porcelain") == ""


def test_a_dirty_tree_is_refused(clone):
    (clone / "README.md").write_text("changed\n")
    run = _Relayout(clone)
    assert run.returncode == 2
    assert "expected a clean checkout" in run.stderr


MERGED = '''"""Merged after the move, naming lingpipe.pipeline.memory's estimate."""

from lingpipe import hyperparams, schedules
from lingpipe.pipeline import costs, schedule_cli, simulate  # the old names
from lingpipe.pipeline import remat as remat_lib
from lingpipe.pipeline.schedule import Action

__all__ = ["F"]


def F():
    """See python -m lingpipe.pipeline.schedule."""
    from lingpipe.pipeline import (
        executor,
        plot,
    )
    from params import lm

    return (hyperparams, schedules.Cosine, costs, schedule_cli.main, simulate, remat_lib,
            Action, executor, plot, lm, "lingpipe/pipeline/timeline.py")
'''

REWRITTEN = '''"""Merged after the move, naming lingpipe.pipeline.observe.memory's estimate."""

from lingpipe import hyperparams, lr_schedules
from lingpipe.pipeline.planning import costs  # the old names
from lingpipe.pipeline.schedules import cli, simulate
from lingpipe.pipeline.schedules.schedule import Action
from lingpipe.pipeline.step import remat as remat_lib

__all__ = ["F"]


def F():
    """See python -m lingpipe.pipeline.schedules."""
    from lingpipe.params import lm
    from lingpipe.pipeline.observe import plot
    from lingpipe.pipeline.step import executor

    return (
        hyperparams,
        lr_schedules.Cosine,
        costs,
        cli.main,
        simulate,
        remat_lib,
        Action,
        executor,
        plot,
        lm,
        "lingpipe/pipeline/observe/timeline.py",
    )
'''


def test_old_paths_in_merged_code_are_rewritten(clone):
    _Commit(clone, {"lingpipe/merged.py": MERGED, "docs/merged.md": "`lingpipe/schedules.py`\n"})
    run = _Relayout(clone)
    assert run.returncode == 0, run.stderr
    assert (clone / "lingpipe/merged.py").read_text() == REWRITTEN
    assert (clone / "docs/merged.md").read_text() == "`lingpipe/lr_schedules.py`\n"


def test_an_old_path_no_rule_rewrites_is_listed(clone):
    code = 'NAME = "plot"\nPATH = f"lingpipe.pipeline.{NAME}"\n__all__ = ["NAME", "PATH"]\n'
    _Commit(clone, {"lingpipe/dynamic.py": code})
    run = _Relayout(clone)
    assert run.returncode == 2
    assert run.stderr.splitlines()[-1] == (
        'relayout: lingpipe/dynamic.py:2: PATH = f"lingpipe.pipeline.{NAME}"'
    )

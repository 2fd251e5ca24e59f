"""The wheel a user installs: only the `lingpipe` package, with its data, and it runs
README's main job from a directory outside the checkout (not an editable install).

The wheel is built from a copy of the checkout's tracked files, so that the build leaves
nothing (build/, *.egg-info) in the checkout. pip builds it in an isolated environment
from its configured index (offline here: a local one).
"""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _Env() -> dict:
    """The environment without this checkout on PYTHONPATH, and TensorFlow quiet."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return dict(env, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (t.decode() for t in tracked)):
        if (REPO / name).is_file():  # Not a file deleted in the working tree.
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_Env(),
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (found,) = out.glob("lingpipe-*.whl")
    return found


def test_the_wheel_holds_only_the_lingpipe_package_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"lingpipe"}
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["lingpipe"]
    for needed in (
        "lingpipe/params/lm.py",  # The registered model params, under lingpipe.
        "lingpipe/inputs/data/digits.csv.gz",  # Package data.
        "lingpipe/pipeline/schedules/__main__.py",
    ):
        assert needed in names
    assert not [n for n in names if n.startswith(("lingpipe/tests", "tests/", "bench/"))]


@pytest.mark.slow
def test_the_installed_wheel_runs_the_main_job_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    # The system's packages (TensorFlow, ...) without downloading them; not the checkout.
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        check=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_Env(),
    )
    assert install.returncode == 0, install.stderr[-3000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import lingpipe, sys; print(lingpipe.__file__)"],
        cwd=away,
        capture_output=True,
        text=True,
        timeout=120,
        env=_Env(),
    )
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    logdir = tmp_path / "lp"
    run = subprocess.run(
        [
            str(python),
            "-m",
            "lingpipe.trainer",
            "--model=lm.TransformerLmTiny",
            f"--logdir={logdir}",
            "--max_steps=2",
        ],
        cwd=away,
        capture_output=True,
        text=True,
        timeout=600,
        env=_Env(),
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert (logdir / "params.txt").is_file()
    assert "cls : lingpipe.lr_schedules." in (logdir / "params.txt").read_text()
    assert list(away.iterdir()) == []  # It wrote only to its logdir.

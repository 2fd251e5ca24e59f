"""The front door: README's size and first screen, the code fences of every page, the
links README gives, the MkDocs site's strict build and its params tables, and
bench/README.md's tables against the committed JSON."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "docs", "hooks"))

import keras_conformance  # noqa: E402
import params_tables  # noqa: E402
import tables  # noqa: E402

PAGES = ["README.md", "CHANGELOG.md", "bench/README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
FENCE_LANGUAGES = {"python", "sh", "text"}


def _Read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def test_readme_is_short_and_its_first_screen_holds_the_two_commands():
    readme = _Read("README.md")
    assert len(readme.splitlines()) <= 250, len(readme.splitlines())
    ci = _Read(".ci/run").splitlines()
    install = next(line for line in ci if line.startswith("pip install"))
    tests = next(line for line in ci if line.startswith("python -m pytest"))
    first_screen = "\n".join(readme.splitlines()[:30])
    assert install in first_screen and tests in first_screen, first_screen


def test_readme_states_no_test_counts_or_timings():
    readme = _Read("README.md")
    found = re.findall(r"\b\d[\d,]* tests\b|\b\d+ min(?:utes)?\b|\bin ~?\d+ s\b", readme)
    assert not found, found


@pytest.mark.parametrize("page", PAGES)
def test_every_fence_names_python_sh_or_text(page):
    """A block a test cannot run (a shell command, output) is ```sh or ```text, never a
    bare fence a reader might paste into Python, nor ```python."""
    opened, bad = False, []
    for number, line in enumerate(_Read(page).splitlines(), 1):
        if not line.startswith("```"):
            continue
        if opened:
            opened = False
            continue
        opened = True
        if line[3:].strip() not in FENCE_LANGUAGES:
            bad.append(f"{page}:{number}: {line!r}")
    assert not bad, bad


def test_readme_links_reach_files_of_the_repository():
    readme = _Read("README.md")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert any(t.startswith("docs/") for t in local), local
    missing = [t for t in local if not os.path.exists(os.path.join(ROOT, t))]
    assert not missing, missing


def test_bench_readme_tables_are_what_tables_py_writes_from_the_json():
    readme = _Read("bench/README.md")
    assert readme == tables.Rewrite(readme, tables.Tables()), (
        "bench/README.md differs from bench/results/*.json: run python bench/tables.py"
    )
    for path in glob.glob(os.path.join(ROOT, "bench", "results", "*.json")):
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem not in tables.ELSEWHERE:
            assert f"`bench/results/{stem}.json`" in readme, stem


def test_tables_show_a_new_benchmarks_json_with_its_machine_and_date(tmp_path):
    """bench/plan.py's JSON (or any new one of the common shape) gets a table as it lands."""
    payload = {
        "machine": {
            "tf": "2.21.0",
            "python": "3.11.7",
            "cpu_count": 16,
            "machine": "x86_64",
            "gpus": ["/physical_device:GPU:0"],
        },
        "date": "2026-12-01",
        "rows": [{"model": "lm.TransformerLmTiny", "predicted_s": 0.0123, "measured_s": None}],
    }
    (tmp_path / "brand_new.json").write_text(json.dumps(payload))
    text = tables.Tables(str(tmp_path))
    assert "### Brand new" in text
    assert "16 CPU cores (x86_64), GPUs: /physical_device:GPU:0, TensorFlow 2.21.0" in text
    assert "- Date: 2026-12-01." in text
    assert "| model | predicted_s | measured_s |" in text
    assert "| lm.TransformerLmTiny | 0.012 | - |" in text


def test_tables_refuse_a_readme_without_markers():
    with pytest.raises(SystemExit, match="expected the markers"):
        tables.Rewrite("# no markers here\n", "")


def test_keras_conformance_page_is_what_its_script_writes_from_the_json():
    result = json.loads(_Read("bench/results/keras_conformance.json"))
    assert _Read("docs/keras_conformance.md") == keras_conformance.Page(result)


def test_params_table_lists_what_params_defines_with_the_bases():
    rows = {
        name: (default, owner)
        for name, default, _, owner in params_tables.ParamsRows(
            "lingpipe.layers.gpipe.PipeliningLayer", ROOT
        )
    }
    from lingpipe.layers import gpipe

    defined = {name for name, _ in gpipe.PipeliningLayer.Params().IterParams()} - {"cls"}
    assert set(rows) == defined
    assert rows["num_micro_batches"] == ("1", "PipeliningLayer")
    assert rows["name"] == ("''", "BaseLayer")


def test_mkdocs_strict_build(tmp_path):
    """mkdocs and mkdocstrings come with the test extra (pip install -e ".[test]")."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "pipelining-layer" / "index.html").read_text()
    assert "num_micro_batches" in api and "ForwardBackward" in api
    keras_api = (tmp_path / "site" / "api" / "keras" / "index.html").read_text()
    assert "split_points" in keras_api


def test_trainer_guide_names_every_flag_of_the_trainers_help():
    shown = subprocess.run(
        [sys.executable, "-m", "lingpipe.trainer", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    flags = set(re.findall(r"^\s+--(?:\[no\])?([a-z_]+)", shown, re.M)) - {"help", "helpfull"}
    assert "max_steps" in flags, shown[-2000:]
    guide = _Read("docs/trainer.md")
    missing = sorted(f for f in flags if f"`--{f}" not in guide)
    assert not missing, missing

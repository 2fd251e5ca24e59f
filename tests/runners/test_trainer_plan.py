"""The trainer's --plan, run in this process: a plan file's flags train as the same
flags given by hand, a flag on the command line wins (and the log says so), the run
writes plan_check.json, and bad input is one line, exit status 2, nothing written."""

import json
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import trainer
from lingpipe.runners import plan_flags

KEY = "lm.TransformerLmTiny"
PLAN = {
    "num_stages": 2,
    "num_micro_batches": 2,
    "schedule": "1f1b",
    "num_virtual_stages": 1,
    "remat": "never",
    "partition": [3, 1],
}
PREDICTED = {"step_seconds": 0.05, "peak_bytes": [3 * 2**20, 2 * 2**20]}


def Main(capsys, *flags):
    """Runs the trainer's main with `flags`; returns (exit status, stderr lines)."""
    capsys.readouterr()
    trainer.FLAGS.unparse_flags()
    # --verbosity=0: absl's INFO lines, as under app.run, for caplog.
    trainer.FLAGS(["trainer", f"--model={KEY}", "--logical_devices=8", "--verbosity=0", *flags])
    try:
        status = trainer.main(["trainer"])
    finally:
        trainer.FLAGS.unparse_flags()
    return status, capsys.readouterr().err.strip().splitlines()


def WritePlan(path, plan=None, made_for=None, **extra):
    written = {
        "for": made_for or {"model": KEY, "devices": 2, "global_batch": 32},
        "plan": PLAN if plan is None else plan,
        "predicted": PREDICTED,
        **extra,
    }
    path.write_text(json.dumps(written))
    return path


def WriteText(path, text):
    path.write_text(text)
    return path


def Weights(logdir):
    """Every variable of the newest checkpoint, by name, as numpy."""
    reader = tf.train.load_checkpoint(os.path.join(logdir, "checkpoints"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def test_a_plan_file_trains_as_its_flags_given_by_hand(capsys, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="absl")
    plan = WritePlan(tmp_path / "plan.json")
    common = ["--max_steps=2", "--mode=train", "--seed=3"]
    status, lines = Main(capsys, f"--logdir={tmp_path / 'plan'}", f"--plan={plan}", *common)
    assert status == 0, lines
    by_hand = [
        "--num_stages=2",
        "--num_micro_batches=2",
        "--schedule=1f1b",
        "--remat=never",
        "--partition=3,1",
    ]
    status, lines = Main(capsys, f"--logdir={tmp_path / 'hand'}", *by_hand, *common)
    assert status == 0, lines
    planned = (tmp_path / "plan" / "params.txt").read_text()
    assert planned == (tmp_path / "hand" / "params.txt").read_text()
    for line in ("num_stages : 2", "schedule : '1f1b'", "remat : 'never'", "partition : [3, 1]"):
        assert line in planned
    a, b = Weights(tmp_path / "plan"), Weights(tmp_path / "hand")
    assert a.keys() == b.keys() and any("pipeline" in k for k in a)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    check = json.loads((tmp_path / "plan" / "plan_check.json").read_text())
    assert check["predicted"] == PREDICTED
    measured = check["measured"]
    assert measured["steps"] == 1 and measured["step_seconds"] > 0
    assert measured["allocators"] == ["all CPU devices (one allocator)"]
    assert len(measured["peak_bytes"]) == 1 and measured["peak_bytes"][0] > 0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan: predicted")]
    percent = round((measured["step_seconds"] - 0.05) / 0.05 * 100)
    ms = measured["step_seconds"] * 1e3
    expected_ms = f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"
    assert said == [
        f"plan: predicted 50 ms and 3.0 MiB per device; measured {expected_ms} ({percent:+d}%)"
    ]
    assert not (tmp_path / "hand" / "plan_check.json").exists()


def Inspect(capsys, *flags):
    """--mode=inspect_params (nothing trained, nothing written): (status, params text)."""
    capsys.readouterr()
    trainer.FLAGS.unparse_flags()
    trainer.FLAGS(["trainer", f"--model={KEY}", "--logical_devices=8", "--verbosity=0", *flags])
    try:
        status = trainer.main(["trainer"])
    finally:
        trainer.FLAGS.unparse_flags()
    return status, capsys.readouterr().out


def test_a_flag_on_the_command_line_wins_and_the_log_says_so(capsys, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="absl")
    plan = WritePlan(tmp_path / "plan.json")
    status, params = Inspect(
        capsys,
        "--mode=inspect_params",
        f"--plan={plan}",
        "--num_micro_batches=4",
        "--schedule=1f1b",  # the plan's own value: nothing to say
    )
    assert status == 0
    assert "num_micro_batches : 4" in params and "partition : [3, 1]" in params
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan: --")]
    assert said == [
        f"plan: --num_micro_batches=4 from the command line wins over --plan={plan}'s 2"
    ]


def test_plan_auto_chooses_within_what_the_command_line_fixes(capsys, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    status, params = Inspect(
        capsys,
        "--mode=inspect_params",
        "--plan=auto",
        "--memory_per_device=64MiB",
        "--strategy=default",
        "--num_stages=2",
        "--num_micro_batches=2",
        "--remat=never",
    )
    assert status == 0
    assert "num_stages : 2" in params and "remat : 'never'" in params
    # Cells per stage of the chosen schedule (a V-shaped one has two stages per device).
    assert re.search(r"partition : \[\d+(, \d+)+\]", params)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan: ")]
    assert "plan: planning for 2 device(s) (--num_stages, one replica: --strategy=default)" in said
    assert any(s.startswith("plan: chose R=1 x K=2, M=2, ") for s in said), said


def test_plan_check_of_a_run_with_no_step_after_the_first(tmp_path):
    check = plan_flags.PlanCheck(str(tmp_path), PREDICTED, devices=None)
    check.Before(1)
    check.After(1, last=True)  # the first step traces: nothing measured
    written = json.loads((tmp_path / "plan_check.json").read_text())
    assert written == {"predicted": PREDICTED, "measured": None}
    assert check.Line(None) == (
        "plan: predicted 50 ms and 3.0 MiB per device; not measured (the run had no step "
        "after its first, which traces)"
    )
    measured = {"step_seconds": 0.0535}
    assert check.Line(measured) == (
        "plan: predicted 50 ms and 3.0 MiB per device; measured 54 ms (+7%)"
    )


def _AssertRefused(status, lines, message):
    assert status == 2, lines
    errors = [line for line in lines if line.startswith("lingpipe.trainer: error: ")]
    assert errors == [lines[-1]], lines
    assert message in lines[-1], lines[-1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--plan=auto"], "--plan=auto: expected --memory_per_device=SIZE"),
        (
            ["--plan=auto", "--memory_per_device=12XB"],
            "--memory_per_device=12XB: expected a positive size such as 16GiB",
        ),
        (["--memory_per_device=1GiB"], "--memory_per_device=1GiB: expected with --plan=auto"),
        (
            ["--plan=auto", "--memory_per_device=1KiB", "--num_stages=2", "--num_micro_batches=2"],
            "--plan=auto: --memory_per_device=1.0 KiB: no plan of lm.TransformerLmTiny on 8 "
            "device(s) fits; the smallest needs",
        ),
    ],
)
def test_bad_plan_flags_are_refused_before_anything_is_written(capsys, tmp_path, flags, message):
    logdir = tmp_path / "run"
    status, lines = Main(capsys, f"--logdir={logdir}", *flags)
    _AssertRefused(status, lines, message)
    assert not logdir.exists()


@pytest.mark.parametrize(
    "write, message",
    [
        (
            lambda p: WritePlan(p, made_for={"model": "lm.Other", "devices": 2}),
            "written for --model=lm.Other, this run's is --model=lm.TransformerLmTiny",
        ),
        (
            lambda p: WritePlan(p, made_for={"model": KEY, "devices": 16}),
            "written for 16 devices, this run has 8 (--logical_devices)",
        ),
        (lambda p: p, "cannot read it (No such file or directory)"),
        (lambda p: WriteText(p, "{not json"), "not JSON (Expecting property name"),
        (
            lambda p: WriteText(p, json.dumps({"plan": PLAN, "predicted": PREDICTED})),
            'expected a JSON object with "plan", "predicted" and "for"',
        ),
        (
            lambda p: WritePlan(p, plan=dict(PLAN, num_stages=0)),
            '"plan" gives num_stages=0: expected a positive integer, received 0',
        ),
        (
            lambda p: WritePlan(p, plan=dict(PLAN, remat="sometimes")),
            "\"plan\" gives remat='sometimes': expected one of always, except_last, never",
        ),
        (
            lambda p: WritePlan(p, plan=dict(PLAN, stages=2)),
            '"plan" gives stages=2: unknown flag; expected one of num_stages,',
        ),
    ],
    ids=["model", "devices", "missing", "json", "no-for", "value", "remat", "unknown"],
)
def test_bad_plan_files_are_refused_before_anything_is_written(capsys, tmp_path, write, message):
    path = write(tmp_path / "plan.json")
    logdir = tmp_path / "run"
    status, lines = Main(capsys, f"--logdir={logdir}", f"--plan={path}")
    _AssertRefused(status, lines, f"--plan={path}: {message}")
    assert not logdir.exists()


def test_the_plan_line_rounds_before_it_signs(tmp_path):
    from lingpipe.runners import plan_flags

    check = plan_flags.PlanCheck(str(tmp_path), {"step_seconds": 0.05, "peak_bytes": [2**20]}, None)
    # 0.4% faster than predicted rounds to 0: "+0%", as a zero reads, never "-0%".
    assert check.Line({"step_seconds": 0.0498}).endswith("measured 50 ms (+0%)")
    assert check.Line({"step_seconds": 0.0535}).endswith("measured 54 ms (+7%)")

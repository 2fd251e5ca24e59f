"""python -m lingpipe.plan: the plan of a registered model, its JSON, and bad input in one
line with exit status 2 and nothing written."""

import json
import subprocess
import sys

import pytest

from lingpipe import plan
from lingpipe.pipeline.planning import planner
from lingpipe.pipeline.schedules import simulate


@pytest.mark.parametrize(
    "text,expected",
    [("16GiB", 16 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096)],
)
def test_sizes(text, expected):
    assert plan.ParseSize(text) == expected


def _Run(tmp_path, *flags):
    cmd = [sys.executable, "-m", "lingpipe.plan", "--model=lm.TransformerLmTiny", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)


@pytest.mark.slow
def test_a_plan_and_its_json(tmp_path):
    out = tmp_path / "plan.json"
    done = _Run(tmp_path, "--devices=2", "--memory_per_device=8MiB", f"--json={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python -m lingpipe.trainer --model=lm.TransformerLmTiny" in done.stdout
    # The tiny LM fits this host: each cell profiled at the smallest and largest
    # micro-batch (32 / 2 replicas / 16, and 32), and the screen says so.
    assert "costs: profiled per cell here (F, I, W at micro-batches of 1 and 32)" in done.stdout
    written = json.loads(out.read_text())
    assert set(written) >= {"plan", "predicted", "candidates"}
    assert written["predicted"]["step_seconds"] > 0
    assert all(b <= 8 * 2**20 for b in written["predicted"]["peak_bytes"])
    assert written["plan"]["num_stages"] in (1, 2)
    assert written["for"] == {
        "model": "lm.TransformerLmTiny",
        "devices": 2,
        "global_batch": 32,
        "memory_per_device": 8 * 2**20,
    }
    # What the trainer's --plan=FILE reads: its flags, the partition as counts per stage.
    from lingpipe.runners import plan_flags

    assert set(written["plan"]) <= set(plan_flags.PLAN_FLAGS)
    assert sum(written["plan"]["partition"]) == 4  # the tiny LM's cells
    assert plan_flags.ReadPlan(str(out), "lm.TransformerLmTiny") == written


@pytest.mark.slow
def test_verify_trains_the_top_plans_and_reads_what_the_trainer_measured(tmp_path):
    # The search restricted to K=1: two replicas without a pipeline (partition [4]).
    # The trainer must take the plan's one-stage partition as it wrote it.
    out = tmp_path / "plan.json"
    flags = ["--devices=2", "--memory_per_device=48MiB", "--costs=flops", "--verify=1"]
    flags.append("--num_stages=1")
    done = _Run(tmp_path, *flags, f"--json={out}")
    assert done.returncode == 0, done.stderr[-2000:]
    verified = json.loads(out.read_text())["verify"]
    assert len(verified) == 1 and "the trainer measured nothing" not in done.stdout
    for v in verified:
        measured = v["measured"]  # the trainer's plan_check.json: its timed steps
        assert measured["steps"] >= 1 and v["measured_seconds"] == measured["step_seconds"] > 0
        assert measured["allocators"] == ["all CPU devices (one allocator)"]
    (line,) = done.stdout.split("verify:")[1].splitlines()[1:2]
    assert " ms / " in line and "%)" in line and "R=2 x K=1" in line, line


class _BadPlan:
    step_seconds, peak_bytes = 0.01, (1, 1)

    def Flags(self):
        return {"schedule": "nope"}

    def Describe(self):
        return "a plan with an unknown schedule"


def test_verify_says_why_the_trainer_measured_nothing():
    made_for = {"model": "lm.TransformerLmTiny", "devices": 2, "global_batch": 32,
                "memory_per_device": 2**30}  # fmt: skip
    ((predicted, measured),) = plan.Verify(made_for, [_BadPlan()], steps=2)
    assert isinstance(measured, str) and "nope" in measured, measured
    line = plan._VerifyLine(predicted, measured, _BadPlan())
    assert line.startswith("      10.0 ms / the trainer measured nothing (") and "nope" in line


@pytest.mark.parametrize(
    "flags,line",
    [
        (["--devices=0", "--memory_per_device=1GiB"], "--devices=0: expected a number of"),
        (["--devices=two", "--memory_per_device=1GiB"], "argument --devices: invalid int value"),
        (["--devices=2"], "the following arguments are required: --memory_per_device"),
        (["--devices=2", "--memory_per_device=1GiB", "--verify=-1"], "--verify=-1: expected a"),
        (["--devices=2", "--memory_per_device=12XB"], "--memory_per_device=12XB: expected a"),
        (["--devices=2", "--memory_per_device=1GiB", "--costs=fast"], "--costs=fast: expected"),
        (
            ["--devices=2", "--memory_per_device=1GiB", "--calibrate=0"],
            "--calibrate=0: expected a number of steps >= 1",
        ),
        (
            ["--devices=2", "--memory_per_device=1GiB", "--schedule=1f1b,1f2b"],
            "--schedule=1f1b,1f2b: expected one or more of gpipe, 1f1b, zero_bubble,",
        ),
        (
            ["--devices=2", "--memory_per_device=1MiB", "--costs=flops"],
            "--memory_per_device=1.0 MiB: no plan of lm.TransformerLmTiny on 2 device(s) fits; "
            "the smallest needs",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path, flags, line):
    out = tmp_path / "plan.json"
    done = _Run(tmp_path, *flags, f"--json={out}")
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("lingpipe.plan:")]
    assert len(errors) == 1 and line in errors[0], done.stderr[-2000:]
    assert "usage:" not in done.stderr, done.stderr  # the one line, not argparse's usage
    assert not out.exists()


def test_the_search_takes_the_trainer_s_flags_as_restrictions():
    import argparse

    def Args(**given):
        return argparse.Namespace(**{f: given.get(f) for f in plan.RESTRICTION_FLAGS})

    assert plan.Restrictions(Args()) == {}
    assert plan.Restrictions(
        Args(
            num_stages="1,2", num_micro_batches="4", schedule="1f1b,interleaved_1f1b", remat="never"
        )
    ) == dict(
        stages=[1, 2],
        micro_batches=[4],
        schedules=[("1f1b", 1), ("interleaved_1f1b", 2)],
        remats=["never"],
    )
    for given, line in [
        (dict(num_stages="0"), "--num_stages=0: expected numbers >= 1, comma-separated"),
        (dict(num_micro_batches="two"), "--num_micro_batches=two: expected numbers >= 1"),
        (dict(remat="sometimes"), "--remat=sometimes: expected one or more of never, except_"),
    ]:
        with pytest.raises(plan.PlanError, match=line):
            plan.Restrictions(Args(**given))
    # Restricted: only what it allows is searched.
    model = plan.RegisteredModel("lm.TransformerLmTiny", None)
    rates = planner.Rates(flops_per_s=1e11, action_s=1e-5, bytes_per_s=1e10, latency_s=1e-5)
    restrict = plan.Restrictions(Args(num_stages="2", schedule="zbv", remat="always"))
    result = plan.Plan(model, 2, 2**30, rates, restrict, costs="flops")
    for c in result.ranked:
        assert (c.num_stages, c.schedule, c.remat) == (2, "zbv", "always")


def test_flops_where_asked_and_where_a_cell_is_too_big_to_profile():
    model = plan.RegisteredModel("lm.TransformerLmTiny", None)
    flop_costs = model.Costs()
    candidates = planner.Candidates(2, 4, 32)
    costs, line = plan.ChooseCosts(model, flop_costs, candidates, 2**30, "flops")
    assert costs.times is None and line == "FLOPs at the measured rate (--costs=flops)"
    need = plan.ProfileNeed(flop_costs, 32)
    assert need == max(3 * w + 4 * o * 32 for w, o in zip(flop_costs.weight_bytes,
                                                          flop_costs.out_bytes))  # fmt: skip
    # A device with less than that: 'auto' falls back to FLOPs, 'profile' is refused.
    small = lambda cap: (need - 1, "this host's available memory")  # noqa: E731
    original, plan.DeviceBytes = plan.DeviceBytes, small
    try:
        costs, line = plan.ChooseCosts(model, flop_costs, candidates, 2**30, "auto")
        assert costs.times is None and line.startswith("FLOPs at the measured rate (profiling")
        refused = r"^--costs=profile: profiling the largest cell of lm.TransformerLmTiny needs "
        with pytest.raises(plan.PlanError, match=refused + r".*; use --costs=flops"):
            plan.ChooseCosts(model, flop_costs, candidates, 2**30, "profile")
    finally:
        plan.DeviceBytes = original


def test_calibrate_fits_the_costs_to_recorded_steps_of_the_best_pipeline():
    # A batch of 4: probes of M=2 and its twin at M=4, each quick to trace.
    model = plan.RegisteredModel("lm.TransformerLmTiny", 4)
    rates = planner.Rates(1e10, action_s=1e-4, bytes_per_s=1e10, latency_s=1e-5)
    result = plan.Plan(model, 2, 2**30, rates, {"micro_batches": [2]}, costs="flops")
    costs, cal_rates, cal, line = plan.Calibrate(model, result, rates, 2, 1)
    best = next(c for c in result.ranked if c.num_stages > 1)
    probes = planner.CalibrationProbes(best, result.costs, 4)
    assert line.startswith(f"calibrated on 1 step(s) each of {best.Describe()} (")
    assert f"; {probes[1].Describe()} (" in line and line.endswith(" ms per step")
    recorded = sum(len(a) for p in probes for a in planner.ScheduleOf(p).device_actions)
    assert cal.num_probes == 2 and 0 < cal.num_actions <= recorded
    assert cal.overhead_s >= 0 and min(cal.scales) > 0
    # The calibrated costs: FLOPs at the rate over the fitted scale, the fitted action cost.
    assert cal_rates.flops_per_s == pytest.approx(rates.flops_per_s / cal.scale)
    assert cal_rates.action_s == pytest.approx(cal.action_s)
    assert cal_rates.step_s == pytest.approx(cal.step_s)
    assert costs.flops == result.costs.flops
    # Simulated with them, the pipeline takes about the measured makespan (two probes
    # fit two step costs exactly, but for a scale per device where the plan has their
    # mean), or more where the busy times alone already exceed it.
    per_action = planner.ActionSeconds(best, costs, cal_rates, 4)
    predicted = simulate.Simulate(planner.ScheduleOf(best), per_action).makespan + cal.step_s
    if cal.step_overhead_s > 0 and cal.step_s > 0:
        assert predicted == pytest.approx(cal.measured_step_s, rel=0.25)
    else:
        assert predicted >= cal.measured_step_s * 0.75


def test_nothing_fits_is_said_before_any_cell_is_profiled(monkeypatch):
    def Profiled(self, flop_costs, sizes):
        raise AssertionError("profiled, though no candidate fits the cap")

    monkeypatch.setattr(plan.RegisteredModel, "Profiled", Profiled)
    model = plan.RegisteredModel("lm.TransformerLmTiny", None)
    rates = planner.Rates(1e10, action_s=1e-4, bytes_per_s=1e10, latency_s=1e-5)
    with pytest.raises(plan.PlanError, match=r"^--memory_per_device=1.0 MiB: no plan of "):
        plan.Plan(model, 2, 2**20, rates, costs="profile")


def test_a_second_search_reuses_each_candidate_s_memory_estimate():
    calls = []

    def Memory(c):
        calls.append(c.Describe())
        return [1] * c.num_stages

    memory = planner.CachedMemory(Memory)
    costs = planner.ModelCosts(flops=(1.0,) * 4, out_bytes=(4,) * 4, weight_bytes=(4,) * 4)
    rates = planner.Rates(1e9, action_s=1e-5, bytes_per_s=1e9, latency_s=1e-6)
    first = planner.Search(costs, rates, 2, 2**30, 8, memory)
    assert len(calls) == first.searched == len(set(calls))
    planner.Search(costs, rates, 2, 2**30, 8, memory)
    assert len(calls) == first.searched


def test_the_peaks_of_two_replicas_are_replica_0_s_which_receives_the_other_s_gradients():
    from lingpipe.pipeline.observe import memory
    from lingpipe.pipeline.step import remat

    model = plan.RegisteredModel("lm.TransformerLmTiny", None)
    two = planner.Candidate(2, 1, 2, "gpipe", 1, "always", (4,))
    # Replica 0's device holds its own gradients and, as the trainer averages them
    # there, the other replica's copies and one mean: here, where the last backward
    # holds the peak, the estimate of a pipeline that receives none (replica 1's) plus
    # the gradients and the largest of them.
    (peak,) = model.Memory(two)
    p = model._PipelineParams(16, **two.Settings())  # noqa: SLF001
    sched = planner.ScheduleOf(two)
    (alone,) = memory.Estimate(
        p, p.cell_tpl, [[0, 1, 2, 3]], tuple(p.input_shapes), sched,
        remat.Kept(sched, "always"), model.params.train.optimizer,
    )  # fmt: skip
    largest = max(v.numpy().nbytes for v in p.Instantiate().trainable_variables)
    assert alone.received == 0
    assert peak - memory.DeviceMemory([alone]).total == alone.gradients + largest


def test_a_cap_too_small_is_refused_before_the_device_s_rates_are_measured(monkeypatch, capsys):
    # The rates only price candidates that fit: with none, measuring them (seconds of
    # timed runs) would only delay the refusal.
    def Measured(*args, **kwargs):
        raise AssertionError("rates measured, though no candidate fits the cap")

    monkeypatch.setattr(planner, "MeasureRates", Measured)
    flags = ["--model=lm.TransformerLmTiny", "--devices=1", "--memory_per_device=1MiB"]
    assert plan.main([*flags, "--costs=flops"]) == 2
    assert "lingpipe.plan: --memory_per_device=1.0 MiB: no plan of " in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, cells",
    [
        ("image.AmoebaNetDigitsTiny", None),
        # The same code at GPipe's sizes: 12 and 10 s (the Adafactor part is also
        # test_update_memory.py's).
        pytest.param("image.AmoebaNetImageNetGPipe", None, marks=pytest.mark.extended),
        ("keras_models.KerasMlp", 3),
        pytest.param("mt.TransformerEncDecGPipe", None, marks=pytest.mark.extended),
    ],
)
def test_every_registered_pipeline_has_costs_and_a_memory_estimate(name, cells):
    # Each failed before the search: the AmoebaNets' PipelineParams wanted a `where`,
    # the Keras MLP's pipeline had no input shapes to cost its cells by, and the
    # translation model's Adafactor could not be traced for its update's memory.
    model = plan.RegisteredModel(name, None)
    costs = model.Costs()
    assert all(f > 0 for f in costs.flops) and len(costs.flops) == (cells or len(costs.flops))
    n = len(costs.flops)
    one = planner.Candidate(1, 2, 1, "gpipe", 1, "never", (n // 2, n - n // 2))
    peaks = model.Memory(one)
    assert len(peaks) == 2 and all(p > 0 for p in peaks), peaks

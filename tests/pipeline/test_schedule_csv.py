"""Schedules users write: placement in the Schedule, torch's compute-only CSV, Resolve,
and the command's --csv. (The engine's imports: tests/test_layout.py.)"""

import pathlib

import pytest
from schedule_cases import Command

from lingpipe.pipeline.schedules import generators, simulate
from lingpipe.pipeline.schedules.schedule import Action, FromCsv, Schedule, ScheduleError, ToCsv

DATA = pathlib.Path(__file__).parent / "data"
V_SHAPED = DATA / "v_shaped_k2_m2.csv"
INTERLEAVED = DATA / "interleaved_k2_v2_m2.csv"


def test_placement_defaults_to_the_loop_and_is_read_by_device_of():
    sched = generators.Make("interleaved_1f1b", 2, 4, 2)
    assert sched.stage_devices == (0, 1, 0, 1)
    assert [sched.DeviceOf(s) for s in range(4)] == [0, 1, 0, 1]
    v = generators.Make("zbv", 3, 6)
    assert v.stage_devices == (0, 1, 2, 2, 1, 0) and v.num_stages == 6
    assert v.StagesOf(0) == [0, 5] and v.ChunkOf(5) == 1 and v.num_virtual_stages == 2
    with pytest.raises(ScheduleError, match=r"expected stage_devices to give each of the 2 stages"):
        Schedule("x", 2, 2, 1, ((), ()), (0, 2))


def test_v_placement_refuses_an_action_on_the_wrong_device():
    good = generators.Make("zbv", 2, 2)
    # Stage 3 lives on device 0 in the V placement: listing it on device 1 is refused.
    lists = [list(good.device_actions[0]), list(good.device_actions[1])]
    f3 = Action("F", 3, 0)
    lists[0].remove(f3)
    lists[1].insert(0, f3)
    moved = Schedule("v", 2, 4, 2, lists, good.stage_devices)
    with pytest.raises(
        ScheduleError, match=r"F s3 mb0 is listed on device 1, but stage 3 lives on device 0"
    ):
        simulate.Simulate(moved)


@pytest.mark.parametrize("path,placement", [(V_SHAPED, (0, 1, 1, 0)), (INTERLEAVED, (0, 1, 0, 1))])
def test_hand_written_fixtures_load_validate_and_round_trip(path, placement):
    text = path.read_text()
    sched = FromCsv(str(path))
    assert (sched.num_devices, sched.num_stages, sched.num_micro_batches) == (2, 4, 2)
    assert sched.stage_devices == placement  # from the row each stage's actions are on
    assert sched.name == path.name
    simulate.Simulate(sched)  # validates
    assert ToCsv(FromCsv(text)) == text
    assert FromCsv(text, num_micro_batches=2).device_actions == sched.device_actions


def test_the_v_shaped_fixture_splits_backwards_and_idles_where_it_says():
    sched = FromCsv(V_SHAPED)
    assert sched.splits_backward
    assert sched.device_actions[0][:3] == (Action("F", 0, 0), Action("F", 0, 1), Action("F", 3, 0))
    sim = simulate.Simulate(sched, costs={"F": 1.0, "I": 1.0, "W": 1.0, "B": 1.0})
    assert sim.start[Action("F", 3, 0)] == 3  # after the empty cell at step 2


@pytest.mark.parametrize("name", generators.SCHEDULES)
def test_every_schedule_survives_csv(name):
    v = 2 if name in generators.VIRTUAL else 1
    sched = generators.Make(name, 4, 8, v)
    back = FromCsv(ToCsv(sched), num_micro_batches=8)
    assert back.device_actions == sched.device_actions
    assert back.stage_devices == sched.stage_devices


def test_csv_errors_name_row_column_and_cell(tmp_path):
    with pytest.raises(
        ScheduleError,
        match=r"\(text\): row 2 \(device 1\), column 3: cannot read cell 'F1', expected "
        r"<stage><F\|B\|I\|W><micro-batch>",
    ):
        FromCsv("0F0,0B0\n,1F0,F1\n")
    with pytest.raises(ScheduleError, match=r"row 2, column 1: 0B0 puts stage 0 on device 1"):
        FromCsv("0F0\n0B0\n")
    with pytest.raises(ScheduleError, match=r"names micro-batch 2, expected one in 0..1"):
        FromCsv("0F0,0F2,0B0", num_micro_batches=2)
    with pytest.raises(ScheduleError, match=r"no row runs stage\(s\) \[1\]"):
        FromCsv("0F0,2F0,0B0,2B0\n")
    with pytest.raises(ScheduleError, match=r"text_or_path=.*missing.csv: no such file"):
        FromCsv(str(tmp_path / "missing.csv"))


def test_a_csv_that_cannot_run_names_the_actions_in_one_line():
    # Device 1 wants the backward of micro-batch 0 of stage 2 before its forward.
    bad = FromCsv(
        V_SHAPED.read_text().replace(",1F0,2F0,", ",1F0,2I0,").replace(",2I0,1I0,", ",2F0,1I0,")
    )
    with pytest.raises(ScheduleError) as e:
        simulate.Simulate(bad)
    assert str(e.value) == (
        "schedule 'csv' deadlocks after 3 of 24 actions: device 0's next action F s3 mb0 "
        "waits for F s2 mb0 (listed later on device 1); device 1's next action I s2 mb0 waits "
        "for F s2 mb0 (listed after it), I s3 mb0 (listed later on device 0); expected each "
        "action after those it waits for"
    )


def test_resolve_takes_a_name_a_schedule_or_a_csv_path():
    assert generators.Resolve("1f1b", 2, 4) == generators.Make("1f1b", 2, 4)
    value = generators.Make("zbv", 2, 4)
    assert generators.Resolve(value, 2, 4) is value
    assert generators.Resolve(str(V_SHAPED), 2, 2) == FromCsv(V_SHAPED)
    assert generators.Resolve(V_SHAPED, 2, 2).stage_devices == (0, 1, 1, 0)
    with pytest.raises(
        ScheduleError,
        match=r"Schedule 'zbv' is for num_devices=2, num_micro_batches=4; expected "
        r"num_devices=4, num_micro_batches=4",
    ):
        generators.Resolve(value, 4, 4)
    with pytest.raises(ScheduleError, match=r"names micro-batch 1, expected one in 0..0"):
        generators.Resolve(str(INTERLEAVED), 2, 1)
    with pytest.raises(
        ScheduleError, match=r"is for num_devices=2, num_micro_batches=2; expected num_devices=3"
    ):
        generators.Resolve(str(INTERLEAVED), 3, 2)
    with pytest.raises(ScheduleError, match=r"unknown schedule 'zvb'.*did you mean 'zbv'"):
        generators.Resolve("zvb", 2, 4)
    with pytest.raises(ScheduleError, match=r"received int 3"):
        generators.Resolve(3, 2, 4)


def test_command_reads_a_csv(tmp_path):
    run = Command(f"--csv={V_SHAPED}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[1].split()[:4] == ["dev", "0", "F0.0", "F1.0"]
    assert "bubble 7.7%" in run.stdout  # 1 idle unit of 13 per device, under B=2 too
    assert "device 0: idle 7.7%; peak alive micro-batches 4 (s0: 2, s3: 2)" in run.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0X0\n")
    run = Command(f"--csv={bad}")
    assert run.returncode == 2 and not run.stdout
    assert "row 1 (device 0), column 2: cannot read cell '0X0'" in run.stderr


def test_the_trainer_flag_takes_a_csv_path_and_refuses_an_unknown_name():
    from lingpipe.runners import startup

    resolved = startup.ResolveParams(
        "lm.TransformerLmTiny", startup.Overrides(schedule=str(V_SHAPED), num_stages=2)
    )
    assert resolved.task.schedule == str(V_SHAPED)
    with pytest.raises(
        startup.UsageError,
        match=r"--schedule=zvb: expected one of .*dualpipev.* or the path of a CSV file; "
        r"did you mean 'zbv'",
    ):
        startup.ResolveParams("lm.TransformerLmTiny", startup.Overrides(schedule="zvb"))


@pytest.mark.parametrize("path", [V_SHAPED, INTERLEAVED])
def test_the_fixtures_train_the_mlp_to_the_reference_gradients(path):
    import tensorflow as tf
    from gpipe_cells import DIMS, Mlp, Pipeline
    from pipeline_reference import AssertSameAsReference

    for spec in (str(path), FromCsv(path)):  # a path, or a Schedule value
        pipe = Pipeline([Mlp()] * 4, 2, 2, "always", schedule=spec)
        assert [pipe.StageDevice(s)[-1] for s in range(4)] == [
            str(d) for d in FromCsv(path).stage_devices
        ]
        AssertSameAsReference(pipe, (tf.random.normal([8, DIMS]),))

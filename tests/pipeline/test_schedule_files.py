"""Schedule CSV files that cannot be read (issue 30): each way (not UTF-8 text, not text
at all, a directory, missing, no permission) is one line naming the file and the
argument that gave it, from FromCsv, Resolve (p.schedule), `--schedule` and
`python -m lingpipe.pipeline.schedules --csv`; a deadlocking CSV is one line naming the
blocked actions."""

import os

import pytest

from lingpipe.pipeline.schedules import cli, generators, schedule, simulate
from lingpipe.pipeline.schedules.schedule import FromCsv, ScheduleError
from lingpipe.runners import startup

EXPECTED = "expected a schedule CSV file (UTF-8 text, a row per device of cells such as 0F0)"


def _Unreadable(path, monkeypatch):
    """`path`, made unreadable: by its mode, or, for root (who reads any file), by `open`."""
    path.write_text("0F0,1F0\n")
    path.chmod(0)
    if os.access(path, os.R_OK):

        def Refused(name, *args, **kwargs):
            raise PermissionError(13, "Permission denied", name)

        monkeypatch.setattr(schedule, "open", Refused, raising=False)
    return path


# name -> (how to make it under tmp_path, what the message says of it)
FILES = {
    "binary.csv": (
        lambda p, _: p.write_bytes(bytes(range(256))),
        "not UTF-8 text (byte 0x80 at offset 128)",
    ),
    "latin1.csv": (
        lambda p, _: p.write_bytes("0F0,1F0 # café\n".encode("latin-1")),
        "not UTF-8 text (byte 0xe9 at offset 13)",
    ),
    "nul.csv": (lambda p, _: p.write_bytes(b"0F0,1F0\x00\n"), "not text (byte 0x00 at offset 7)"),
    "plans": (lambda p, _: p.mkdir(), "it is a directory"),
    "missing.csv": (lambda p, _: None, "no such file"),
    "locked.csv": (_Unreadable, "cannot read it (Permission denied)"),
}


def _Entries(path):
    """{argument: a call that reads `path` for it, raising ScheduleError or UsageError}."""

    def Command():
        status = cli.main([f"--csv={path}"])
        raise ScheduleError(f"exit status {status}")

    return {
        "text_or_path": lambda: FromCsv(path),
        "schedule": lambda: generators.Resolve(path, 2, 2),
        "--schedule": lambda: startup.ResolveParams(
            "lm.TransformerLmTiny", startup.Overrides(schedule=path, num_stages=2)
        ),
        "--csv": Command,
    }


@pytest.mark.parametrize("argument", ["text_or_path", "schedule", "--schedule", "--csv"])
@pytest.mark.parametrize("name", FILES)
def test_an_unreadable_schedule_file_is_one_line_naming_it_and_its_argument(
    tmp_path, monkeypatch, capsys, name, argument
):
    make, problem = FILES[name]
    path = tmp_path / name
    make(path, monkeypatch)
    message = f"{argument}={path}: {problem}; {EXPECTED}"
    with pytest.raises((ScheduleError, startup.UsageError)) as raised:
        _Entries(str(path))[argument]()
    if argument == "--csv":
        out, err = capsys.readouterr()
        assert (str(raised.value), out, err) == (
            "exit status 2",
            "",
            f"lingpipe.pipeline.schedules: error: {message}\n",
        )
    else:
        assert str(raised.value) == message


DEADLOCK = "0F0,0B0\n1B0,1F0\n"  # device 1 lists its backward before its forward
DEADLOCK_LINE = (
    "deadlocks after 1 of 4 actions: device 0's next action B s0 mb0 waits for B s1 mb0 "
    "(blocked, next on device 1); device 1's next action B s1 mb0 waits for F s1 mb0 "
    "(listed after it); expected each action after those it waits for"
)


def test_a_deadlocking_csv_is_one_line_naming_the_blocked_actions(tmp_path, capsys):
    path = tmp_path / "dead.csv"
    path.write_text(DEADLOCK)
    with pytest.raises(ScheduleError) as raised:
        simulate.Simulate(FromCsv(DEADLOCK))
    assert str(raised.value) == f"schedule 'csv' {DEADLOCK_LINE}"
    assert cli.main([f"--csv={path}"]) == 2
    assert capsys.readouterr() == (
        "",
        f"lingpipe.pipeline.schedules: error: schedule 'dead.csv' {DEADLOCK_LINE}\n",
    )
    with pytest.raises(startup.UsageError) as raised:
        startup.ResolveParams(
            "lm.TransformerLmTiny", startup.Overrides(schedule=str(path), num_stages=2)
        )
    assert str(raised.value) == f"--schedule={path}: schedule 'dead.csv' {DEADLOCK_LINE}"

"""Pipeline schedules as data: for each device, the ordered list of its actions.

An action is (kind, stage, micro-batch): `F` a forward, `B` a backward (input and
weight gradients together), and, for zero bubble, `I` (the gradient of the
stage's inputs) and `W` (its weights' gradient) apart. A stage is a chunk of the
model; a device runs one or more stages, as the schedule's `stage_devices` says.

    sched = generators.Make('1f1b', num_stages=4, num_micro_batches=8)
    sched.device_actions[0]   # (F s0 mb0, F s0 mb1, F s0 mb2, F s0 mb3, B s0 mb0, ...)
    sched.DeviceOf(3)         # 3
    sim = simulate.Simulate(sched)   # validates; makespan, bubble, peak alive per stage
    FromCsv("schedules/zbv.csv", num_micro_batches=8)   # torch's compute-only CSV; ToCsv

The types (Action, Schedule, ScheduleError, the kinds) are defined in
lingpipe.pipeline.schedules.actions, below the simulation, and exported here; this module adds
torch's CSV format, whose writer (ToCsv) runs the simulation. The generators by name
(`gpipe`, `1f1b`, ...) are in lingpipe.pipeline.schedules.generators;
`python -m lingpipe.pipeline.schedules` prints a schedule's grid and figures.
"""

from __future__ import annotations

import csv
import io
import os
import re

from lingpipe.pipeline.schedules import simulate
from lingpipe.pipeline.schedules.actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    KINDS,
    Action,
    Schedule,
    ScheduleError,
)

__all__ = [
    "BACKWARD",
    "BACKWARD_INPUT",
    "BACKWARD_WEIGHT",
    "FORWARD",
    "KINDS",
    "Action",
    "FromCsv",
    "FromCsvFile",
    "Schedule",
    "ScheduleError",
    "ToCsv",
]


_CELL = re.compile(r"^(\d+)([FBIW])(\d+)$")


def _Cell(cell: str, where: str, d: int, c: int) -> Action | None:
    """The action of one cell (None when empty); `where` and d, c place it in messages."""
    match = _CELL.match(cell.strip())
    if cell.strip() and not match:
        raise ScheduleError(
            f"schedule CSV {where} (device {d}), column {c + 1}: cannot read cell {cell!r}, "
            "expected <stage><F|B|I|W><micro-batch> such as 0F0 or 7I3, or an empty cell for "
            "an idle step"
        )
    return Action(match.group(2), int(match.group(1)), int(match.group(3))) if match else None


def FromCsv(text_or_path: str | os.PathLike, num_micro_batches: int | None = None) -> Schedule:
    """A schedule read from torch.distributed.pipelining's compute-only CSV.

    Row d is device d's actions, one per time step; a cell is `<stage><F|B|I|W><micro-batch>`
    (`0F0`, `7I3`) or empty (idle). A stage lives on the device whose row lists it.
    Not validated against dependencies: simulate.Simulate does that.

    Args:
      text_or_path: the CSV text, or the path of a file that holds it (anything that
        exists there, or a one-line name ending in .csv; FromCsvFile).
      num_micro_batches: M when known; a cell naming micro-batch >= M is refused.
        None: one more than the largest micro-batch listed.

    Raises:
      ScheduleError: a file that cannot be read as text (FromCsvFile), a malformed cell
        (with its row, column and text), a stage on two devices, a stage no row lists,
        or a micro-batch out of range.
    """
    spec = os.fspath(text_or_path)
    one_line = "\n" not in spec and "," not in spec
    if os.path.exists(spec) or (one_line and spec.strip().lower().endswith(".csv")):
        return FromCsvFile(spec, num_micro_batches, argument="text_or_path")
    return _Parse(spec, "text", "csv", num_micro_batches)


def FromCsvFile(
    path: str | os.PathLike, num_micro_batches: int | None = None, argument: str = "path"
) -> Schedule:
    """FromCsv of the file at `path`, named after it.

    Args:
      argument: what gave the path (`--csv`, `schedule`), named in the errors.

    Raises:
      ScheduleError: as FromCsv; for a file that is missing, a directory, unreadable or
        not UTF-8 text, one line `<argument>=<path>: <why>; expected ...`.
    """
    path = os.fspath(path)
    text = _ReadText(path, argument)
    return _Parse(text, f"file {path}", os.path.basename(path), num_micro_batches)


def _ReadText(path: str, argument: str) -> str:
    """The UTF-8 text of the file at `path` (a BOM dropped); ScheduleError if it has none."""
    at = f"{argument}={path}"
    expected = "expected a schedule CSV file (UTF-8 text, a row per device of cells such as 0F0)"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ScheduleError(f"{at}: no such file; {expected}") from None
    except IsADirectoryError:
        raise ScheduleError(f"{at}: it is a directory; {expected}") from None
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ScheduleError(f"{at}: cannot read it ({reason}); {expected}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScheduleError(
            f"{at}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); {expected}"
        ) from None
    if "\x00" in text:  # valid UTF-8, but no text editor writes it
        where = len(text[: text.index("\x00")].encode("utf-8"))
        raise ScheduleError(f"{at}: not text (byte 0x00 at offset {where}); {expected}")
    return text.removeprefix("\ufeff")  # spreadsheets save UTF-8 CSV with a BOM


def _Parse(text: str, where: str, name: str, num_micro_batches: int | None) -> Schedule:
    """The schedule of CSV `text`; `where` ('text', 'file F') places it in messages."""
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()  # trailing blank lines are no devices
    if not rows:
        raise ScheduleError(f"schedule CSV ({where}): expected one row per device, received none")
    device_actions, stage_devices = [], {}
    for d, row in enumerate(rows):
        acts = [_Cell(cell, f"({where}): row {d + 1}", d, c) for c, cell in enumerate(row)]
        for c, a in [(c, a) for c, a in enumerate(acts) if a]:
            at = f"schedule CSV ({where}): row {d + 1}, column {c + 1}: {row[c].strip()}"
            other = stage_devices.setdefault(a.stage, d)
            if other != d:
                raise ScheduleError(
                    f"{at} puts stage {a.stage} on device {d}, but row {other + 1} already "
                    f"runs it on device {other}"
                )
            if num_micro_batches is not None and a.micro_batch >= num_micro_batches:
                raise ScheduleError(
                    f"{at} names micro-batch {a.micro_batch}, expected one in "
                    f"0..{num_micro_batches - 1} (num_micro_batches={num_micro_batches})"
                )
        device_actions.append(tuple(a for a in acts if a))
    num_stages = max(stage_devices) + 1
    missing = [s for s in range(num_stages) if s not in stage_devices]
    if missing:
        raise ScheduleError(
            f"schedule CSV ({where}): no row runs stage(s) {missing}; expected every stage "
            f"0..{num_stages - 1} on some device"
        )
    micro = num_micro_batches or 1 + max(a.micro_batch for acts in device_actions for a in acts)
    placement = tuple(stage_devices[s] for s in range(num_stages))
    return Schedule(name, len(rows), num_stages, micro, tuple(device_actions), placement)


def ToCsv(sched: Schedule) -> str:
    """`sched` as compute-only CSV (FromCsv's format): each action in the time step at
    which it starts when every action takes one step and starts as soon as its device
    is free and its inputs are ready (torch's grids count steps the same way)."""
    sim = simulate.Simulate(sched, costs={kind: 1.0 for kind in KINDS})
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for acts in sched.device_actions:
        row = [""] * round(max((sim.end[a] for a in acts), default=0.0))
        for a in acts:
            row[round(sim.start[a])] = f"{a.stage}{a.kind}{a.micro_batch}"
        writer.writerow(row)
    return out.getvalue()

"""`python -m lingpipe.pipeline.schedules`: a schedule's grid, bubble and peak alive.

    python -m lingpipe.pipeline.schedules --schedule=zbv --num_stages=4 --num_micro_batches=8
    python -m lingpipe.pipeline.schedules --csv=my_schedule.csv --png=/tmp/plan.png

prints simulate.Grid and simulate.Figures under the default costs (F = I = W = 1, B = 2),
which has a line `bubble N.N%`. A schedule that cannot run, or a --csv file that cannot
be read, exits with status 2 and one line on stderr that says which action or file and
why.
"""

from __future__ import annotations

import sys

from lingpipe import command_line
from lingpipe.pipeline.schedules import generators, simulate
from lingpipe.pipeline.schedules.schedule import FromCsvFile, ScheduleError

__all__ = [
    "main",
]


def main(argv: list[str] | None = None) -> int:
    """Runs the command on `argv` (default sys.argv); returns the exit status."""
    parser = command_line.ArgumentParser("lingpipe.pipeline.schedules")
    names = ", ".join(generators.SCHEDULES)
    parser.add_argument("--schedule", default="gpipe", help=f"one of {names}")
    parser.add_argument("--num_stages", type=int, default=4, help="K, the devices")
    parser.add_argument("--num_micro_batches", type=int, default=8, help="M")
    parser.add_argument("--num_virtual_stages", type=int, default=1, help="v, stages per device")
    parser.add_argument("--csv", default="", help="read the schedule from this CSV file instead")
    parser.add_argument("--list", action="store_true", help="also print each device's list")
    parser.add_argument("--png", default="", help="also draw the plan to this PNG file")
    args = parser.parse_args(argv)
    counts = args.num_stages, args.num_micro_batches, args.num_virtual_stages
    try:
        if args.csv:
            sched = FromCsvFile(args.csv, argument="--csv")
        else:
            sched = generators.Make(args.schedule, *counts)
        sim = simulate.Simulate(sched)
    except ScheduleError as e:
        print(f"lingpipe.pipeline.schedules: error: {e}", file=sys.stderr)
        return 2
    print(simulate.Grid(sched, sim), simulate.Figures(sched, sim), sep="\n\n")
    if args.list:
        print(f"\n{sched}")
    if args.png:
        from lingpipe.pipeline.observe import plot  # matplotlib and TensorFlow only when drawing

        print(f"\nwrote {plot.PlotSimulation(sched, sim, args.png)}")
    return 0

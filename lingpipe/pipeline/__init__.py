"""The GPipe engine, in four parts, each module testable alone.

- `step/`: running a training step: micro-batch split and merge (micro_batch), the
  executor that creates each action's ops in the schedule's order (executor, driver),
  recomputation (remat), stage devices and their context (placement, stage_context),
  mixed precision (precision), gradient sums (gradient_sums), XLA per stage (xla).
- `schedules/`: schedules as data: the actions (actions), torch's CSV (schedule), the
  schedules by name (generators, controllable_memory), the simulation (simulate), and
  `python -m lingpipe.pipeline.schedules` (cli).
- `planning/`: cutting the cells into stages (partition), their costs (costs), the
  stages table (report), and the search for a plan (planner).
- `observe/`: looking at a run: the memory estimate (memory), the measured timeline
  (timeline), and pictures (plot).

`lingpipe.layers.gpipe.PipeliningLayer` puts them together.

The flat module paths of the previous release (`lingpipe.pipeline.schedule`, ...)
still import for one release, with a DeprecationWarning naming the new path.
"""

from lingpipe import _moved

__all__: list[str] = []

# Each module's previous path below lingpipe.pipeline, and its path now.
_MOVED = {
    "controllable_memory": "schedules.controllable_memory",
    "costs": "planning.costs",
    "driver": "step.driver",
    "executor": "step.executor",
    "generators": "schedules.generators",
    "gradient_sums": "step.gradient_sums",
    "memory": "observe.memory",
    "micro_batch": "step.micro_batch",
    "partition": "planning.partition",
    "placement": "step.placement",
    "planner": "planning.planner",
    "plot": "observe.plot",
    "precision": "step.precision",
    "remat": "step.remat",
    "report": "planning.report",
    "schedule": "schedules.schedule",
    "schedule_cli": "schedules.cli",
    "simulate": "schedules.simulate",
    "stage_context": "step.stage_context",
    "timeline": "observe.timeline",
    "xla": "step.xla",
}

_moved.Install(
    __name__,
    _MOVED,
    commands={
        "schedule": "lingpipe.pipeline.schedules",
        "schedule_cli": "lingpipe.pipeline.schedules",
    },
)

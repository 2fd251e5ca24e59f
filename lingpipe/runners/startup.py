"""The trainer's start-up: resolve the params, check the logdir, set up the devices.

Everything here runs before anything is written: a bad model name, override or
logdir raises `UsageError` (the trainer prints it and exits with status 2), and
the logdir is created only once the params resolve.

The params of a run are the registered model's (`model_registry.GetParams(key,
'Train')`), then `--params_file`, then `--params_override`, then the shortcut
flags (`--max_steps`, `--seed`, and one per pipeline setting: `--num_stages`,
`--num_micro_batches`, `--schedule`, ..., lingpipe.pipeline.step.settings.FLAGS), in that
order. Overrides use Lingvo's text: `a.b : 1; c.d : 'x'`, one assignment per `;`
or line, values read as literals and never run as code.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from typing import Any

from lingpipe import glob_paths, hyperparams, model_registry
from lingpipe.pipeline.schedules import generators
from lingpipe.pipeline.step import settings

__all__ = [
    "CheckLogdir",
    "CheckProfileSteps",
    "IsUrl",
    "Overrides",
    "PARAMS_DIFF_FILE",
    "PARAMS_FILE",
    "ResolvedParams",
    "ResolveParams",
    "SplitOverrides",
    "UsageError",
    "WriteAtomically",
    "WriteParams",
    "WritesParams",
]

PARAMS_FILE = "params.txt"
PARAMS_DIFF_FILE = "params_diff.txt"


class UsageError(ValueError):
    """Input the user can fix: the message says what was received and what was expected."""


# What the flags change in the registered params: the files and overrides, then one
# field per pipeline setting with a trainer flag (settings.FLAGS), None when not given.
Overrides = dataclasses.make_dataclass(
    "Overrides",
    [
        ("params_file", "str | None", dataclasses.field(default=None)),
        ("params_override", str, dataclasses.field(default="")),
        ("max_steps", "int | None", dataclasses.field(default=None)),
        ("seed", "int | None", dataclasses.field(default=None)),
        *[(name, Any, dataclasses.field(default=None)) for name in settings.FLAGS],
    ],
    namespace={"__doc__": "What the flags change in the registered params."},
)
Overrides.__module__ = __name__


@dataclasses.dataclass
class ResolvedParams:
    """The params of a run, and those of the registered model they started from."""

    key: str
    task: hyperparams.InstantiableParams  # with input = the Train dataset's
    defaults: hyperparams.InstantiableParams
    eval_datasets: list[str]  # 'Dev', 'Test', ...: every dataset but Train
    overrides: Overrides

    def EvalTaskParams(self, dataset: str) -> hyperparams.InstantiableParams:
        """The run's task params with `input` set to `dataset`'s input params."""
        p = self.task.Copy()
        p.input = model_registry.GetParams(self.key, dataset).input
        if self.overrides.seed is not None and "seed" in p.input:
            p.input.seed = self.overrides.seed
        return p


def SplitOverrides(text: str) -> list[str]:
    """Splits `a : 1; b : "x;y"` at `;` and newlines outside quotes and brackets."""
    parts, current, quote, depth = [], [], None, 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            current.append(c)
            if c == "\\" and i + 1 < len(text):
                current.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            current.append(c)
        elif c in "([{":
            depth += 1
            current.append(c)
        elif c in ")]}":
            depth -= 1
            current.append(c)
        elif c in ";\n" and depth <= 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


# Methods a class must override to be instantiable: the bases raise TypeError in them.
_MUST_DEFINE = {
    "lingpipe.lr_schedules.BaseSchedule": "_Value",
    "lingpipe.optimizers.BaseOptimizer": "_CreateKerasOptimizer",
}
_DTYPE_PARAMS = ("dtype", "fprop_dtype")
_SEED_PARAMS = ("random_seed", "seed")


def _ValueProblem(name: str, value: object) -> str | None:
    """What is wrong with `value` for the param `name` (dotted) that the params' own
    type check lets through, or None: a dtype that is no floating-point dtype, a seed
    that is no integer, a class left abstract (it would fail only once built)."""
    import inspect

    from lingpipe import params_text

    leaf = name.rsplit(".", 1)[-1]
    text = params_text.ClassName(value) if isinstance(value, type) else params_text.TextOf(value)
    if leaf in _DTYPE_PARAMS and value is not None:
        if not (params_text.IsDType(value) and value.is_floating):
            return (
                f"{name}: expected a floating-point dtype (tf.float32, tf.bfloat16, tf.float16, "
                f"tf.float64) or None, received {text}"
            )
    if leaf in _SEED_PARAMS and value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{name}: expected an integer >= 0 or None, received {text}"
    if isinstance(value, type):
        for base in value.__mro__:
            method = _MUST_DEFINE.get(params_text.ClassName(base))
            if method and getattr(value, method) is getattr(base, method):
                return (
                    f"{name}: expected a class that defines {method} (a subclass of "
                    f"{params_text.ClassName(base)}), received {text}, which does not"
                )
        if inspect.isabstract(value):
            return f"{name}: expected a concrete class, received {text}, which is abstract"
    return None


def _Apply(p: hyperparams.Params, text: str, source: str) -> None:
    """Applies `name : value` assignments in order; raises UsageError naming `source`."""
    from lingpipe import params_text

    for assignment in SplitOverrides(text):
        try:
            p.FromText(assignment)
        except (AttributeError, ValueError, TypeError) as e:
            raise UsageError(f"{source}: cannot apply {assignment!r}: {e}") from None
        parts = params_text.SplitLine(assignment)
        if parts is not None and (problem := _ValueProblem(parts[0], p.Get(parts[0]))):
            raise UsageError(f"{source}: {problem}")


def _CheckPositive(value: int, flag: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"--{flag}: expected a positive integer, received {value!r}")


def _SetSetting(p: hyperparams.Params, name: str, value: Any) -> None:
    """The pipeline setting `name` from its flag (text, or a value from Python)."""
    if value is None:
        return
    kind = settings.Get(name).kind
    flag = f"--{name}" if kind == "int" else f"--{name}={value}"
    if isinstance(value, str) and kind not in ("schedule", "int"):
        try:
            value = settings.FromText(name, value)
        except ValueError as e:
            raise UsageError(str(e)) from None
    elif problem := settings.Problem(name, value):
        raise UsageError(f"{flag}: {_Suggest(name, value, problem)}")
    if name not in p:
        raise UsageError(
            f"{flag}: the task {p.cls.__name__} has no param {name!r}, so it cannot be "
            "set from the command line (is the task pipelined?)"
        )
    p.Set(**{name: value})
    if name == "schedule" and generators.IsCsvPath(value):
        _CheckScheduleFile(value)


def _Suggest(name: str, value: Any, problem: str) -> str:
    """`problem`, with "did you mean" for a misspelt schedule."""
    import difflib

    if name != "schedule":
        return problem
    close = difflib.get_close_matches(str(value), settings.TrainSchedules(), n=1)
    return problem + (f"; did you mean {close[0]!r}?" if close else "")


def ResolveParams(key: str, overrides: Overrides) -> ResolvedParams:
    """The params of model `key` with `overrides` applied (see the module docstring).

    Raises:
      UsageError: unknown model, unreadable params file, or a bad override.
    """
    try:
        defaults = model_registry.GetParams(key, "Train")
        datasets = model_registry.GetClass(key).Datasets()
    except ValueError as e:
        raise UsageError(f"--model={key}: {e}") from None
    p = defaults.Copy()
    if overrides.params_file:
        try:
            with open(overrides.params_file) as f:
                text = f.read()
        except OSError as e:
            raise UsageError(
                f"--params_file={overrides.params_file}: cannot read it ({e.strerror}); "
                "expected a text file of 'name : value' lines"
            ) from None
        _Apply(p, text, f"--params_file={overrides.params_file}")
    if overrides.params_override:
        _Apply(p, overrides.params_override, "--params_override")
    if overrides.max_steps is not None:
        _CheckPositive(overrides.max_steps, "max_steps")
        p.train.max_steps = overrides.max_steps
    for name in settings.FLAGS:
        _SetSetting(p, name, getattr(overrides, name))
    if overrides.seed is not None:
        if isinstance(overrides.seed, bool) or overrides.seed < 0:
            raise UsageError(f"--seed: expected an integer >= 0, received {overrides.seed!r}")
        p.random_seed = overrides.seed
        if p.input is not None and "seed" in p.input:
            p.input.seed = overrides.seed
    return ResolvedParams(
        key=key,
        task=p,
        defaults=defaults,
        eval_datasets=[d for d in datasets if d != "Train"],
        overrides=overrides,
    )


def _CheckScheduleFile(path: str) -> None:
    """Reads and simulates --schedule's CSV file, so that one that cannot be read or run
    is refused naming the flag (the pipeline checks it again against its K and M)."""
    from lingpipe.pipeline.schedules import schedule, simulate

    try:
        simulate.Simulate(schedule.FromCsvFile(path, argument="--schedule"))
    except schedule.ScheduleError as e:
        message = str(e)
        if not message.startswith("--schedule="):
            message = f"--schedule={path}: {message}"
        raise UsageError(message) from None


def IsUrl(path: str) -> bool:
    """Whether `path` names a file system by scheme (gs://, ram://, hdfs://...)."""
    return "://" in path


def CheckLogdir(logdir: str) -> str:
    """Returns the logdir to use; it may not exist yet, but must be creatable as a directory.

    A local path comes back absolute; a URL (`gs://bucket/run`, `ram://run`) comes
    back as it is and is checked through `tf.io.gfile`, so it never turns into a
    local `./gs:/bucket/run`. Nothing is created here (that waits until
    everything else has been checked).

    Raises:
      UsageError: the path is empty, holds characters TensorFlow reads as a glob
        (`glob_paths`), is a file, lies under a file, or its file system cannot be
        reached.
    """
    if not logdir:
        raise UsageError(
            "--logdir: expected a directory for checkpoints and summaries, received ''"
        )
    if problem := glob_paths.Refusal(logdir, f"--logdir={logdir}", flag="--logdir"):
        raise UsageError(problem)
    if IsUrl(logdir):
        _CheckIsNoFile(logdir.rstrip("/"), logdir)
        return logdir.rstrip("/")
    path = os.path.abspath(os.path.expanduser(logdir))
    _CheckIsNoFile(path, logdir)
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(
            f"--logdir={logdir}: {parent} is a file, so {path} cannot be created; expected a "
            "directory (existing or to create)"
        )
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--logdir={logdir}: {parent} is not writable")
    return path


def _CheckIsNoFile(path: str, logdir: str) -> None:
    """Raises UsageError if `path` is a file or its file system cannot be reached."""
    import tensorflow as tf

    try:
        is_file = tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)
    except tf.errors.OpError as e:
        reason = e.message.strip().splitlines()[0] if e.message.strip() else type(e).__name__
        raise UsageError(
            f"--logdir={logdir}: cannot reach it ({reason}); expected a directory this "
            "process can write to"
        ) from None
    if is_file:
        raise UsageError(
            f"--logdir={logdir}: {path} is a file; expected a directory (existing or to create)"
        )


def WriteAtomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: never half a file.

    Through `tf.io.gfile`, so `path` may be a URL; files get the usual mode (0644
    under a 022 umask).

    Raises:
      rundir.LogdirWriteError: it cannot be written (the message says why).
    """
    import tensorflow as tf

    directory, name = path.rsplit("/", 1) if "/" in path else (".", path)
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(text)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException as e:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        if isinstance(e, (tf.errors.OpError, OSError)):
            from lingpipe.runners import rundir

            # The environment (a full disk, no permission): exit status 1, one line.
            raise rundir.LogdirWriteError(f"cannot write {path}: {rundir.Reason(e)}") from None
        raise


def WriteParams(logdir: str, resolved: ResolvedParams) -> tuple[str, str]:
    """Writes the full params text and its diff against the registered defaults.

    Returns (params text, diff text). The diff's `>` lines are this run's values,
    `<` lines the registered model's.
    """
    text = resolved.task.ToText()
    diff = resolved.task.TextDiff(resolved.defaults)
    header = f"# Params of {resolved.key} as run by lingpipe.trainer.\n"
    WriteAtomically(f"{logdir}/{PARAMS_FILE}", header + text)
    diff_header = (
        f"# Where this run differs from the registered {resolved.key}:\n"
        "# '>' this run, '<' the registered default.\n"
    )
    WriteAtomically(f"{logdir}/{PARAMS_DIFF_FILE}", diff_header + diff)
    return text, diff


def CheckProfileSteps(
    steps: tuple[int, int] | None, max_steps: int, flag: str
) -> tuple[int, int] | None:
    """`steps` (--profile_steps as first, last) if the run reaches its first step.

    Raises:
      UsageError: the run ends (at train.max_steps) before the first step to profile:
        it would profile nothing (a range that starts in time and ends after
        max_steps profiles up to max_steps).
    """
    if steps is not None and steps[0] > max_steps:
        raise UsageError(
            f"--profile_steps={flag}: the run ends at step {max_steps} (train.max_steps), "
            f"before step {steps[0]}; expected steps A,B with A <= {max_steps}, so that "
            "something is profiled"
        )
    return steps


def WritesParams(logdir: str, mode: str) -> bool:
    """Whether a run of `mode` writes params.txt and params_diff.txt: training does;
    --mode=eval only into a logdir without them (its flags are not the run's)."""
    import tensorflow as tf

    return mode != "eval" or not tf.io.gfile.exists(f"{logdir}/{PARAMS_FILE}")

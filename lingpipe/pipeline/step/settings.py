"""The pipeline settings, declared once: name, default, one line of doc, accepted values.

Every front end derives its knobs from SETTINGS: PipeliningLayer.Params and the tasks'
params (Define), the trainer's flags (DefineFlags, and startup's overrides), the
planner's plan (lingpipe.plan) and the Keras constructors' defaults and docstrings
(Default, ArgsDoc). A setting changes here, everywhere at once.

    p = hyperparams.Params()
    settings.Define(p, 'num_stages')                   # p.num_stages, default 1
    settings.Default('partition')                      # 'uniform' (DEFAULTS.partition)
    settings.FromText('partition', '[2, 3]')           # [2, 3]: a flag's text as a value

Vocabulary: a stage is a chunk of the model (the schedule's unit); a device runs one
stage, or several (num_virtual_stages, or the two of a V-shaped schedule).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

from lingpipe.pipeline.schedules import generators
from lingpipe.pipeline.step import remat

__all__ = [
    "ArgsDoc",
    "BY_NAME",
    "Default",
    "DEFAULTS",
    "Define",
    "DefineFlags",
    "Documented",
    "FLAGS",
    "FlagText",
    "FromText",
    "Get",
    "PARTITION_POLICIES",
    "Problem",
    "Setting",
    "SETTINGS",
    "TASK",
    "TrainSchedules",
]

PARTITION_POLICIES = ("uniform", "flops", "params", "profile")


def TrainSchedules() -> tuple[str, ...]:
    """The schedules a training step may run, from the registry (generators.TRAINING)."""
    return generators.TRAINING


@dataclasses.dataclass(frozen=True)
class Setting:
    """One pipeline setting.

    kind: 'int' (a positive integer), 'bool', 'name' (one of `choices`, or a list of
      them with one per stage when `per_stage`), 'partition' (a policy of choices or
      a list of counts per stage), 'schedule' (a registered name or a CSV path), or
      'devices' (a list of device names or None).
    flag: whether the trainer has a --flag for it (devices are the strategy's).
    """

    name: str
    default: Any
    doc: str
    kind: str
    choices: tuple[str, ...] = ()
    flag: bool = True

    @property
    def text_types(self) -> tuple[type, ...]:
        """The types a params file or --params_override may give (Params.Define)."""
        if self.kind in ("name", "partition"):
            return (str, list, tuple)
        if self.kind == "schedule":
            return (str,)
        return ()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "num_stages",
        1,
        "Devices the pipeline runs on (K; 1: no pipeline); the schedule may give each "
        "device several stages (num_virtual_stages, or two for the V-shaped schedules).",
        "int",
    ),
    Setting("num_micro_batches", 1, "Micro-batches each batch is split into (M).", "int"),
    Setting(
        "schedule",
        "gpipe",
        "Order of the training step's work and the stages' placement: "
        + ", ".join(TrainSchedules())
        + " (lingpipe.pipeline.schedules.generators), the path of a CSV file (torch's "
        "compute-only format; see python -m lingpipe.pipeline.schedules), or from Python a "
        "schedule.Schedule value.",
        "schedule",
        TrainSchedules(),
    ),
    Setting(
        "num_virtual_stages",
        1,
        "Stages per device for the loop-placed interleaved schedules ("
        + ", ".join(s for s in generators.VIRTUAL if s in TrainSchedules())
        + "): stage s on device s mod num_stages.",
        "int",
    ),
    Setting(
        "remat",
        "always",
        "Recompute each stage's forward in backward: "
        + ", ".join(remat.POLICIES)
        + " ('except_last' keeps, per stage, the micro-batch whose backward follows its "
        "forward most closely), or a list of them with one per stage of the schedule.",
        "name",
        remat.POLICIES,
    ),
    Setting(
        "partition",
        "uniform",
        "How the model is cut into stages: 'uniform' (by count of cells or layer calls), "
        "'flops' or 'params' (from the shapes), 'profile' (measured time per cell), or "
        "a list of counts per stage.",
        "partition",
        PARTITION_POLICIES,
    ),
    Setting(
        "jit_compile_stages",
        False,
        "Compile each stage's work with XLA for its device (cells without batch norm).",
        "bool",
    ),
    Setting(
        "devices",
        None,
        "Device names, one per device of the pipeline; None takes the cluster's first "
        "num_stages (accelerators first).",
        "devices",
        flag=False,
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
# The defaults as attributes, for signatures: `num_stages: int = settings.DEFAULTS.num_stages`.
DEFAULTS = types.SimpleNamespace(**{s.name: s.default for s in SETTINGS})
TASK = tuple(s.name for s in SETTINGS if s.name != "devices")  # a task's pipeline params
FLAGS = tuple(s.name for s in SETTINGS if s.flag)  # the trainer's --flags


def Get(name: str) -> Setting:
    """The setting `name`; ValueError naming the settings when there is none."""
    if name not in BY_NAME:
        raise ValueError(
            f"pipeline settings: unknown setting {name!r}, expected one of {', '.join(BY_NAME)}"
        )
    return BY_NAME[name]


def Default(name: str) -> Any:
    """The default of setting `name` (a Keras constructor's signature uses it)."""
    return Get(name).default


def Define(p: Any, name: str) -> None:
    """Defines setting `name` in Params `p` with its default, doc and text types."""
    s = Get(name)
    p.Define(s.name, s.default, s.doc, text_types=s.text_types)


def DefineFlags(flags: Any, names: tuple[str, ...] = FLAGS) -> None:
    """Defines a trainer --flag per setting of `names`, default None (the task's value)."""
    for name in names:
        s = Get(name)
        help_text = f"{s.doc} Sets the task's {s.name}."
        if s.kind == "int":
            flags.DEFINE_integer(s.name, None, help_text)
        elif s.kind == "bool":
            flags.DEFINE_bool(s.name, None, help_text)
        else:
            if s.kind in ("name", "partition"):
                help_text += " A list as '[a, b]' or 'a,b'."
            flags.DEFINE_string(s.name, None, help_text)


def FlagText(value: Any) -> str:
    """A setting's value as its flag's text, which FromText reads back: lists as 'a,b'."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(x) for x in value)
    return str(value)


def FromText(name: str, text: str) -> Any:
    """A flag's text as setting `name`'s value: '2' for an int, 'never', '[2, 3]',
    'always,never' (a list without brackets), '4' for a partition of one stage, 'gpipe'
    or a CSV path.

    Raises:
      ValueError: a value the setting does not take (saying what it takes).
    """
    s = Get(name)
    text = str(text).strip()
    value: Any = text
    if s.kind == "int":
        try:
            value = int(text)
        except ValueError:
            value = None
    elif s.kind in ("name", "partition"):
        inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        if inner != text or "," in text:  # [a, b], ['a', 'b'] or a,b
            value = [x.strip().strip("'\"") for x in inner.split(",") if x.strip()]
        if isinstance(value, list) and s.kind == "partition":
            value = [int(x) if x.isdigit() else x for x in value]
        elif s.kind == "partition" and text.isdigit():
            value = [int(text)]  # one stage's count: a plan without a pipeline (K=1)
    if problem := Problem(name, value, shown=repr(text)):
        raise ValueError(f"--{name}={text}: {problem}")
    return value


def Problem(name: str, value: Any, shown: str | None = None) -> str | None:
    """What is wrong with `value` for setting `name` (None: nothing), naming it as
    `shown` (default: its repr); the checks that need the model (a list's length, a
    CSV file's contents) are the pipeline's."""
    s = Get(name)
    shown = repr(value) if shown is None else shown
    if s.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"expected a positive integer, received {shown}"
    elif s.kind == "bool":
        if not isinstance(value, bool):
            return f"expected true or false, received {shown}"
    elif s.kind == "name":
        items = value if isinstance(value, (list, tuple)) else [value]
        if not items or any(x not in s.choices for x in items):
            return (
                f"expected one of {', '.join(s.choices)} or a list of them with one per stage, "
                f"received {shown}"
            )
    elif s.kind == "partition":
        if isinstance(value, (list, tuple)):
            if not value or any(
                not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in value
            ):
                return f"expected a list of positive counts per stage, received {shown}"
        elif value not in s.choices:
            return (
                f"expected one of {', '.join(s.choices)} or a list of counts per stage such "
                f"as [2, 3], received {shown}"
            )
    elif s.kind == "schedule":
        if not isinstance(value, str) or (
            value not in s.choices and not generators.IsCsvPath(value)
        ):
            return f"expected one of {', '.join(s.choices)} or the path of a CSV file"
    return None


def ArgsDoc(names: tuple[str, ...], indent: str = "      ") -> str:
    """Docstring lines 'name: doc (default: x)' for the settings `names` (the Keras
    constructors append them to their Args)."""
    lines = []
    for name in names:
        s = Get(name)
        lines.append(f"{indent}{s.name}: {s.doc} Default: {s.default!r}.")
    return "\n".join(lines)


def Documented(*names: str) -> Any:
    """A class decorator that appends the settings `names`, each with its doc line and
    default, to the class's docstring (its Args name only what is its own)."""

    def Decorate(cls: Any) -> Any:
        doc = (cls.__doc__ or "").rstrip()
        cls.__doc__ = (
            f"{doc}\n\n    Pipeline settings (lingpipe.pipeline.step.settings):\n{ArgsDoc(names)}\n"
        )
        return cls

    return Decorate

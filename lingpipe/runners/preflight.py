"""Everything a run needs, built and checked before anything is written.

    plan = preflight.Prepare(resolved, layout, tasks, logdir, mode)

builds the inputs the mode reads and the evaluators, and checks:

- each input's batches against the model: the replicas and micro-batches the
  global batch splits into (`Layout.BatchPlan`), then a trace of one replica's
  forward on the shapes of its batches (`Layout.TraceForward`; nothing runs), in
  which the layers' own checks (a sequence longer than `max_len`, a
  micro-batch count above the batch) raise;
- when the logdir holds checkpoints, that the newest readable one was written by
  this model: the same variables with the same shapes (`tf.train.load_checkpoint`),
  saying which variable changed otherwise;
- in `--mode=eval`, that there is a checkpoint to evaluate;
- that no file the run writes in the logdir is in the way (`params.txt` that is a
  directory, `checkpoints` that is a file);
- in `--mode=export`, that the export directory is no file, lies under none, holds
  nothing but an earlier export (it is never written beside other files), and that
  `--export_dir` has no character TensorFlow's loaders read as a glob (`glob_paths`).

Every failure is a `startup.UsageError` (the trainer prints one line and exits with
status 2), raised before the first byte reaches the logdir.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

import tensorflow as tf

from lingpipe import glob_paths, hyperparams
from lingpipe.nested_map import NestedMap
from lingpipe.runners import rundir, startup, strategies

__all__ = [
    "BuildInput",
    "CheckBatches",
    "CheckCheckpoint",
    "CheckExportDir",
    "CheckFits",
    "CHECKPOINT_SUBDIR",
    "CheckpointVariables",
    "CheckRunFiles",
    "Differences",
    "ModelVariables",
    "NumMicroBatches",
    "Plan",
    "Prepare",
]

CHECKPOINT_SUBDIR = "checkpoints"
_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass
class Plan:
    """What the checks built; the run starts from here."""

    checkpoint_dir: str
    checkpoint: str | None  # the newest readable checkpoint, or None for a fresh run
    train_input: Any = None  # None in --mode=eval
    batch_plan: str = ""  # how the training batch splits over replicas and micro-batches
    evalers: list = dataclasses.field(default_factory=list)


def Prepare(
    resolved: startup.ResolvedParams,
    layout: strategies.Layout,
    tasks: list,
    logdir: str,
    mode: str,
    export_dir: str | None = None,
) -> Plan:
    """Builds and checks what `mode` needs (see the module docstring); writes nothing.

    `export_dir`: --mode=export's --export_dir (None: LOGDIR/export/STEP).

    Raises:
      startup.UsageError: an input cannot be built or does not fit the model, the
        checkpoint was written by another model, there is nothing to evaluate, or a
        file or directory is in the way of what the run writes.
    """
    if mode == "export" and export_dir:
        if problem := glob_paths.Refusal(export_dir, f"--export_dir={export_dir}", "--export_dir"):
            raise startup.UsageError(problem)
        CheckExportDir(export_dir, f"--export_dir={export_dir}")
    if mode != "export":
        CheckRunFiles(logdir, [d.lower() for d in resolved.eval_datasets])
    checkpoint_dir = f"{logdir}/{CHECKPOINT_SUBDIR}"
    plan = Plan(checkpoint_dir, CheckCheckpoint(checkpoint_dir, tasks[0], logdir))
    if mode == "eval" and plan.checkpoint is None:
        raise startup.UsageError(
            f"--mode=eval: no checkpoint in {checkpoint_dir}; train first (--mode=train)"
        )
    if mode == "export" and not export_dir and plan.checkpoint is not None:
        default = f"{logdir}/export/{plan.checkpoint.rsplit('-', 1)[-1]}"
        CheckExportDir(default, f"the export directory {default} (--export_dir's default)")
    micro = NumMicroBatches(resolved.task)
    traced: set[str] = set()
    if mode != "eval":
        plan.train_input = BuildInput(resolved.task.input, "Train")
        plan.batch_plan = CheckBatches(layout, tasks[0], plan.train_input, micro, "Train", traced)
    if mode in ("eval", "train_and_eval"):
        for dataset in resolved.eval_datasets:
            eval_input = BuildInput(resolved.EvalTaskParams(dataset).input, dataset)
            CheckBatches(layout, tasks[0], eval_input, micro, dataset, traced)
            try:
                evaler = layout.MakeEvaler(tasks, eval_input, dataset, logdir, resolved.key)
            except ValueError as e:
                raise startup.UsageError(f"the {dataset} evaluation: {e}") from None
            plan.evalers.append(evaler)
    return plan


def NumMicroBatches(task_params: hyperparams.Params) -> int:
    """The task's micro-batches per replica batch (1 for a task that does not pipeline)."""
    return task_params.num_micro_batches if "num_micro_batches" in task_params else 1


def BuildInput(params: hyperparams.InstantiableParams | None, dataset: str) -> Any:
    """Instantiates the input generator of `dataset`; UsageError if it cannot be built."""
    if params is None:
        raise startup.UsageError(
            f"the task has no input params for {dataset}; expected the registered model "
            "to set them (model_registry.GetParams(key, dataset).input)"
        )
    try:
        return params.Instantiate()
    except ValueError as e:
        raise startup.UsageError(f"the {dataset} input cannot be built: {e}") from None


def _Shapes(spec: Any) -> str:
    """'ids: [32, 64], labels: [32, 64]' of a structure of TensorSpecs."""
    if isinstance(spec, NestedMap):
        items = spec.FlattenItems()
    else:
        items = list(enumerate(tf.nest.flatten(spec)))
    return ", ".join(f"{path}: {s.shape.as_list()}" for path, s in items)


def CheckBatches(
    layout: strategies.Layout,
    task: Any,
    input_generator: Any,
    num_micro_batches: int,
    dataset: str,
    traced: set[str],
) -> str:
    """Checks `input_generator`'s batches against the layout and the model.

    Traces the forward once per distinct batch signature (`traced` holds those
    already traced). Returns the batch plan (how the batch splits).
    """
    batch_plan = layout.BatchPlan(input_generator.params.batch_size, num_micro_batches)
    try:
        spec = input_generator.GetDataset(layout.InputContext()).element_spec
    except ValueError as e:
        raise startup.UsageError(f"the {dataset} input: {e}") from None
    signature = repr(spec)
    if signature in traced:
        return batch_plan
    try:
        layout.TraceForward(task, spec)
    except ValueError as e:
        raise startup.UsageError(
            f"the {dataset} input's batches ({_Shapes(spec)} per replica) do not fit the model: {e}"
        ) from None
    traced.add(signature)
    return batch_plan


def ModelVariables(task: Any) -> dict[str, list[int]]:
    """{checkpoint key: shape} of the task's variables, keys as in the trainer's
    checkpoints ('task/pipeline/cell_0/emb/emb'), from TensorFlow's own object graph."""
    root = tf.train.Checkpoint(task=task)
    view = tf.train.TrackableView(root)
    out = {}

    def Walk(obj: Any, prefix: str) -> None:
        for name, child in view.children(obj).items():
            path = f"{prefix}/{name}" if prefix else name
            if isinstance(child, tf.Variable):
                out[path] = child.shape.as_list()
            else:
                Walk(child, path)

    Walk(root, "")
    return out


def CheckpointVariables(path: str) -> dict[str, list[int]] | None:
    """{key: shape} of the task's variables (not the optimizer's) in checkpoint `path`;
    None if it cannot be read (the checkpointer then falls back or says why)."""
    try:
        shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError):
        return None
    return {
        key[: -len(_VALUE_SUFFIX)]: list(shape)
        for key, shape in shapes.items()
        if key.startswith("task/")
        and key.endswith(_VALUE_SUFFIX)
        and not key.startswith("task/optimizer/")
    }


def _Candidates(checkpoint_dir: str) -> list[str]:
    """The checkpoints of `checkpoint_dir`, newest first: those of its state file or,
    without one, those whose index files are there."""
    if not tf.io.gfile.isdir(checkpoint_dir):
        return []
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is not None and state.all_model_checkpoint_paths:
        return list(reversed(state.all_model_checkpoint_paths))
    # Listed, not globbed: the directory's name may hold glob characters.
    names = [n for n in tf.io.gfile.listdir(checkpoint_dir) if n.endswith(".index")]
    paths = [f"{checkpoint_dir}/{n[: -len('.index')]}" for n in names]
    number = lambda p: int(m.group(1)) if (m := re.search(r"-(\d+)$", p)) else -1  # noqa: E731
    return sorted(paths, key=number, reverse=True)


def Differences(there: dict[str, list[int]], here: dict[str, list[int]]) -> list[str]:
    """What differs between a checkpoint's variables (`there`) and the model's (`here`)."""
    out = []
    for key in sorted(set(there) | set(here)):
        if key not in here:
            out.append(f"{key} {there[key]} is there and not in this model")
        elif key not in there:
            out.append(f"{key} {here[key]} is in this model and not there")
        elif there[key] != here[key]:
            out.append(f"{key} has shape {there[key]} there and {here[key]} here")
    return out


def CheckCheckpoint(checkpoint_dir: str, task: Any, logdir: str) -> str | None:
    """The newest readable checkpoint in `checkpoint_dir`, or the newest if none can be
    read (the checkpointer then says why); None if there is none.

    Raises:
      startup.UsageError: it was written by a model with other variables or shapes.
    """
    candidates = _Candidates(checkpoint_dir)
    for path in candidates:
        there = CheckpointVariables(path)
        if there is None:
            continue
        differences = Differences(there, ModelVariables(task))
        if differences:
            more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
            raise startup.UsageError(
                f"the checkpoint {path} was written by a different model: "
                f"{differences[0]}{more}; use another --logdir or the checkpoint's params "
                f"({logdir}/{startup.PARAMS_FILE})"
            )
        return path
    # None can be read: the checkpointer says why when it restores.
    return candidates[0] if candidates else None


# What a SavedModel directory holds: an earlier export there is replaced.
_SAVED_MODEL_NAMES = frozenset(
    ["saved_model.pb", "variables", "assets", "fingerprint.pb", "keras_metadata.pb"]
)


def CheckRunFiles(logdir: str, datasets: list[str]) -> None:
    """Raises UsageError if a file the run writes in `logdir` is a directory, or a
    directory it writes into is a file (`datasets`: the eval datasets, lower case)."""
    files = [startup.PARAMS_FILE, startup.PARAMS_DIFF_FILE, rundir.RUN_STATE_FILE]
    files += [rundir.LOCK_FILE] + [f"eval_{d}.json" for d in datasets]
    dirs = [CHECKPOINT_SUBDIR, "train"] + [f"eval_{d}" for d in datasets]
    problems = [(f, True, "a directory", "a file") for f in files]
    problems += [(d, False, "a file", "a directory") for d in dirs]
    for name, is_dir, found, expected in problems:
        path = f"{logdir}/{name}"
        if tf.io.gfile.exists(path) and tf.io.gfile.isdir(path) == is_dir:
            raise startup.UsageError(
                f"--logdir={logdir}: {path} is {found}; expected {expected} the run "
                "writes (move it away or choose another --logdir)"
            )


def CheckExportDir(directory: str, what: str) -> None:
    """Raises UsageError (saying `what`) if `directory` is a file, lies under one, or
    holds anything but an earlier SavedModel."""
    path = directory.rstrip("/")
    while path and not tf.io.gfile.exists(path):
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent == path:
            break
        path = parent
    expected = "expected a directory (new, empty, or holding an earlier export)"
    if path and not tf.io.gfile.isdir(path):
        raise startup.UsageError(f"{what}: {path} is a file; {expected}")
    if path != directory.rstrip("/"):
        return
    others = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(path))
    others = [n for n in others if n not in _SAVED_MODEL_NAMES]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise startup.UsageError(
            f"{what}: it holds {shown}, which an export would sit beside; {expected}"
        )


def _MachineMemory() -> int:
    """Bytes of this machine's physical memory (0 if unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _GiB(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**40 else f"{n / 2**30:,.0f} GiB"


def CheckFits(model: str, task_params: hyperparams.InstantiableParams) -> None:
    """Refuses a model whose pipeline stage cannot fit in memory, before it is built.

    The task is built in a throw-away graph (its variables get shapes, not memory),
    and each stage's weights, their gradients and the optimizer's slots (the terms
    of `lingpipe.pipeline.observe.memory`'s estimate that need no input shapes: a lower
    bound of the stage's memory in a step) are compared with the machine's memory,
    as each stage alone and all together. Only when the stages are on this
    machine's CPU (no GPU or TPU): an accelerator's memory is not known before TF
    starts. A task that cannot be built here is left for the real build to report.

    Raises:
      startup.UsageError: naming the stage, its estimate and the limit.
    """
    from lingpipe.layers import gpipe
    from lingpipe.pipeline.observe import memory
    from lingpipe.runners import inspect_model

    limit = _MachineMemory()
    accelerators = tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU")
    if not limit or accelerators:
        return
    with tf.Graph().as_default():
        try:
            task = task_params.Instantiate()
        except Exception:  # noqa: BLE001 (the real build says what is wrong)
            return
        optimizer = inspect_model.TaskOptimizer(task)
        stages = []
        for node in inspect_model._Walk(task):
            if not isinstance(node, gpipe.PipeliningLayer):
                continue
            for k, idx in enumerate(node.stage_cells):
                weights = [v for i in idx for v in getattr(node, f"cell_{i}").variables]
                trainable = [v.shape.as_list() for v in weights if v.trainable]
                size = weights[0].dtype.size if weights else 4
                need = sum(int(v.shape.num_elements()) * v.dtype.size for v in weights)
                need += sum(math.prod(s) for s in trainable) * size
                need += memory.SlotBytes(optimizer, trainable, size)
                stages.append((f"stage {k} of {node.path} (on {node.StageDevice(k)})", need))
    slots = f" ({optimizer.cls.__name__})" if optimizer is not None else ""
    where = f"beyond the {_GiB(limit)} of this machine's memory (the stages are on its CPU)"
    advice = "expected a smaller model, more stages, or a machine with more memory"
    for name, need in stages:
        if need > limit:
            raise startup.UsageError(
                f"--model={model} does not fit: {name} needs at least {_GiB(need)} for its "
                f"weights, gradients and optimizer slots{slots}, {where}; {advice}"
            )
    total = sum(need for _, need in stages)
    if total > limit:
        raise startup.UsageError(
            f"--model={model} does not fit: its {len(stages)} stages need at least "
            f"{_GiB(total)} together for their weights, gradients and optimizer slots"
            f"{slots}, {where}; {advice}"
        )

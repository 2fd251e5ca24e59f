"""Export: a task as a SavedModel that TensorFlow alone can load and serve.

    from lingpipe import export
    export.Export(task, '/tmp/lm_export')                      # pipelined, as trained
    export.Export(task, '/tmp/lm_one', single_device=True)     # all stages on one device

    # Anywhere, with only TensorFlow installed:
    loaded = tf.saved_model.load('/tmp/lm_export')
    out = loaded.signatures['serving_default'](ids=ids)   # the LM: ids [b, t], 0-padded
    out['logits'], out['predictions']                # [b, t, vocab], [b, t]: any b and t
    metrics = loaded.signatures['eval'](ids=..., labels=..., paddings=..., weights=...)

Two signatures. `serving_default` takes the model's inputs only, for any batch
size, and returns its predictions: for a task with `ServingInputSpecs()` and
`Serve(theta, **inputs)` (the language model: ids in, next-token logits and
predicted ids out), those; for another task, its input batch with the
batch dimension left open and its eval predictions. `eval` takes the whole input
batch (labels and weights too; any batch size) and returns the task's
predictions in eval mode and the values of its metrics (`loss`, `log_pplx`, ...)
under the flattened names of the batch's keys (nested keys joined by '_').
Both run in eval mode: no dropout, batch norm's moving statistics.

Only the eval path is saved: training under a tape runs the pipeline as a custom
gradient, which a SavedModel cannot hold ("invalid capture ... custom
gradients"); eval runs the forward-only schedule, plain calls. The pipelined
export keeps each stage's ops on the device it was trained on: a process with
those devices (e.g. as many logical CPUs) runs it as a pipeline, one without them
places the ops where it can (TensorFlow's soft placement). `single_device=True`
rebuilds the task with one stage (on the first accelerator, else CPU:0), reads
the trained weights into it by their layer paths, and saves that.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import tensorflow as tf

from lingpipe import base_layer, glob_paths
from lingpipe.models import base_task
from lingpipe.nested_map import NestedMap

__all__ = [
    "EVAL_SIGNATURE",
    "Export",
    "InputSpecs",
    "SIGNATURE",
    "SingleDeviceCopy",
]

SIGNATURE = "serving_default"  # the inputs in, predictions out
EVAL_SIGNATURE = "eval"  # the whole input batch in, predictions and metrics out


def _Names(structure: Any, prefix: str = "") -> dict[str, Any]:
    """{name: leaf} of a NestedMap (keys joined by '_'), a tensor, or a tuple/list."""
    if isinstance(structure, dict):
        items = NestedMap.FromNestedDict(dict(structure)).FlattenItems()
        return {f"{prefix}{k.replace('.', '_')}": v for k, v in items}
    leaves = tf.nest.flatten(structure)
    if len(leaves) == 1 and not isinstance(structure, (tuple, list)):
        return {prefix.rstrip("_") or "output": leaves[0]}
    return {f"{prefix or 'output_'}{i}": leaf for i, leaf in enumerate(leaves)}


def InputSpecs(task: base_task.BaseTask) -> dict[str, tf.TensorSpec]:
    """The eval signature's inputs: the names and specs of the task's input batch, the
    batch dimension (0) open."""
    spec = task.CreateInputGenerator().GetDataset().element_spec
    names = _Names(spec)
    return {
        k: tf.TensorSpec([None] + s.shape.as_list()[1:], s.dtype, name=k) for k, s in names.items()
    }


def _EvalFunction(task: base_task.BaseTask, specs: dict[str, tf.TensorSpec]) -> Any:
    """tf.function(**batch) -> {name: tensor}: predictions and metric values, eval mode."""
    template = NestedMap.FromNestedDict(dict(task.CreateInputGenerator().GetDataset().element_spec))
    keys = [k for k, _ in template.FlattenItems()]

    def Evaluate(**flat: tf.Tensor) -> dict[str, tf.Tensor]:
        batch = template.Pack([flat[k.replace(".", "_")] for k in keys])
        with base_layer.EvalMode():
            predictions = task.ComputePredictions(task.theta, batch)
            metrics = task.ComputeLoss(task.theta, predictions, batch)
        outputs = _Names(predictions)
        for name, (value, _) in metrics.items():
            outputs[name if name not in outputs else f"metric_{name}"] = value
        return outputs

    return tf.function(Evaluate, autograph=False).get_concrete_function(**specs)


def _ServingFunction(task: base_task.BaseTask) -> Any | None:
    """tf.function(**inputs) -> {name: tensor} of the task's Serve, or None if it has none."""
    if not hasattr(task, "ServingInputSpecs") or not hasattr(task, "Serve"):
        return None
    specs = task.ServingInputSpecs()

    def Serve(**inputs: tf.Tensor) -> dict[str, tf.Tensor]:
        with base_layer.EvalMode():
            return dict(task.Serve(task.theta, **inputs))

    return tf.function(Serve, autograph=False).get_concrete_function(**specs)


def SingleDeviceCopy(task: base_task.BaseTask) -> base_task.BaseTask:
    """The task rebuilt with one pipeline stage, holding `task`'s weights (by layer path)."""
    p = task.params.Copy()
    if "num_stages" not in p:
        raise ValueError(
            f"{task.path}: single_device=True needs a pipelined task (params with "
            f"num_stages), received {type(task).__name__}"
        )
    p.num_stages, p.num_virtual_stages = 1, 1
    copy = p.Instantiate()
    with tempfile.TemporaryDirectory() as tmp:
        path = tf.train.Checkpoint(task=task).write(os.path.join(tmp, "weights"))
        tf.train.Checkpoint(task=copy).read(path).expect_partial().assert_existing_objects_matched()
    return copy


def Export(task: base_task.BaseTask, directory: str, single_device: bool = False) -> str:
    """Saves `task`'s serving and eval paths as a SavedModel in `directory` (see the
    module docstring); returns `directory`.

    Args:
      task: a built task whose params have an input (the signature's shapes).
      directory: where to write (any path tf.io.gfile knows).
      single_device: rebuild the task as one stage on one device before saving.

    Raises:
      ValueError: `directory` holds a character TensorFlow reads as a glob (`[`, `]`,
        `*`, `?`, `\\`): its loaders could not read the SavedModel.
    """
    # Before anything is built or written: TensorFlow could not load it back.
    if problem := glob_paths.Refusal(directory, f"export.Export: directory={directory}"):
        raise ValueError(problem)
    if single_device:
        task = SingleDeviceCopy(task)
    evaluate = _EvalFunction(task, InputSpecs(task))
    serve = _ServingFunction(task) or evaluate
    root = tf.Module()
    # Only the weights the two paths read: not the optimizer, nor the loss scale.
    weights = {v.ref(): v for v in evaluate.variables + serve.variables}
    root.weights = list(weights.values())
    tf.saved_model.save(root, directory, signatures={SIGNATURE: serve, EVAL_SIGNATURE: evaluate})
    return directory

"""A keras_hub task's preprocessing, for the pipeline of that task.

keras_hub's tasks (GPT2CausalLM, BertTextClassifier, ...) carry a preprocessor: their
fit, evaluate and predict batch the data given (strings, say) and map the task's
`preprocess_samples` over the batches (tokenize, pad, make a causal LM's labels from
its inputs) before Keras sees them. `lingpipe.keras.Pipeline(task)` runs the task's
graph, not its methods, so it does the same here:

    preprocess = Preprocessor(task)          # None where the model has no preprocessor
    kwargs = Fit(preprocess, fit_args, fit_kwargs, where)   # keras.Model.fit's arguments

As keras_hub does, the data are batched in order (no shuffling: a tf.data dataset),
a dataset given is mapped as it is, and validation_split takes the last rows of arrays.
Unlike keras_hub, the preprocessing a dataset is mapped through is traced once per
preprocessor and kind of batch (_Traced), not once per fit, evaluate or predict: GPT2's
byte-pair tokenizer took 2.3 s to trace here, each time. It is traced again once the
preprocessor's config changes (its sequence_length, say), as Keras traces a model's
step again only when it must.
"""

from __future__ import annotations

import inspect
import json
import math
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras import tree

__all__ = ["Arguments", "Evaluate", "Fit", "Predict", "Preprocessor"]

_DEFAULT_BATCH = 32  # Keras' and keras_hub's batch_size when none is given


def Preprocessor(model: Any) -> Callable | None:
    """`model.preprocess_samples` where `model` has a preprocessor (a keras_hub task
    built with one), else None."""
    if getattr(model, "preprocessor", None) is None:
        return None
    return getattr(model, "preprocess_samples", None)


# preprocessor -> (its config as JSON, its task's preprocess_samples in a tf.function)
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _Traced(preprocess: Callable) -> Callable:
    """`preprocess` (a task's preprocess_samples) as a tf.function kept for its
    preprocessor while the preprocessor's config stays the same (module doc); as it is
    where the config cannot be written as JSON."""
    preprocessor = getattr(getattr(preprocess, "__self__", None), "preprocessor", None)
    if preprocessor is None:
        return preprocess
    try:
        config = json.dumps(preprocessor.get_config(), sort_keys=True, default=repr)
    except NotImplementedError:  # Layer.get_config's answer to arguments it cannot serialize
        return preprocess
    kept = _TRACED.get(preprocessor)
    if kept is None or kept[0] != config or kept[1].python_function != preprocess:
        kept = (config, tf.function(preprocess, autograph=True))
        _TRACED[preprocessor] = kept
    return kept[1]


def Arguments(method: Callable, args: tuple, kwargs: dict) -> dict:
    """`args` and `kwargs` of a call of keras.Model's `method` (fit, evaluate, ...) by
    name, self left out."""
    bound = inspect.signature(method).bind(None, *args, **kwargs).arguments
    bound.pop("self")
    bound.update(bound.pop("kwargs", {}))
    return bound


def _Dataset(preprocess: Callable, x: Any, y: Any, sample_weight: Any, batch_size, where: str):
    """x (y, sample_weight) in batches of `batch_size`, each mapped through `preprocess`."""
    if isinstance(x, tf.data.Dataset):
        given = {"y": y, "sample_weight": sample_weight, "batch_size": batch_size}
        extra = [name for name, value in given.items() if value is not None]
        if extra:
            raise ValueError(
                f"{where}: received a tf.data.Dataset and {', '.join(extra)}; a dataset "
                "holds its own labels, weights and batches: pass only the dataset"
            )
        ds = x
    else:
        data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        ds = tf.data.Dataset.from_tensor_slices(data).batch(batch_size or _DEFAULT_BATCH)
    traced = _Traced(preprocess)
    return ds.map(traced, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _Split(data: tuple, fraction: float, where: str) -> tuple[tuple, tuple]:
    """(the first rows, the last `fraction` of rows) of arrays, as keras.Model.fit
    splits them for validation_split."""
    leaves = [v for v in tree.flatten(data) if v is not None]
    if not all(isinstance(v, (np.ndarray, tf.Tensor)) for v in leaves):
        kinds = sorted({type(v).__name__ for v in leaves})
        raise ValueError(
            f"{where}: validation_split with a keras_hub preprocessor needs NumPy arrays "
            f"or tensors, and received {', '.join(kinds)}; pass np.array(...) of the data, "
            "or validation_data"
        )
    at = int(math.floor(int(leaves[0].shape[0]) * (1.0 - fraction)))

    def Part(start, stop):
        return tree.map_structure(lambda v: None if v is None else v[start:stop], data)

    return Part(0, at), Part(at, None)


def Fit(preprocess: Callable, args: tuple, kwargs: dict, where: str) -> dict:
    """keras.Model.fit's arguments with the training and validation data preprocessed
    (module doc): x a dataset, y, sample_weight and batch_size None."""
    a = Arguments(keras.Model.fit, args, kwargs)
    train = (a.get("x"), a.get("y"), a.get("sample_weight"))
    validation = a.get("validation_data")
    if a.get("validation_split") and validation is None:
        train, validation = _Split(train, a["validation_split"], where)
    batch_size = a.get("batch_size")
    a.update(x=_Dataset(preprocess, *train, batch_size, where), y=None, sample_weight=None)
    a.update(batch_size=None, validation_split=0.0)
    if validation is not None:
        if isinstance(validation, tf.data.Dataset):
            a["validation_data"] = _Dataset(preprocess, validation, None, None, None, where)
        else:
            vx, vy, vw = keras.utils.unpack_x_y_sample_weight(validation)
            size = a.get("validation_batch_size") or batch_size
            a["validation_data"] = _Dataset(preprocess, vx, vy, vw, size, where)
            a["validation_batch_size"] = None
    return a


def Evaluate(preprocess: Callable, args: tuple, kwargs: dict, where: str) -> dict:
    """keras.Model.evaluate's arguments with the data preprocessed; as given where fit
    evaluates its validation data, already preprocessed."""
    a = Arguments(keras.Model.evaluate, args, kwargs)
    if a.get("_use_cached_eval_dataset"):
        return a
    x = _Dataset(
        preprocess, a.get("x"), a.get("y"), a.get("sample_weight"), a.get("batch_size"), where
    )
    a.update(x=x, y=None, sample_weight=None, batch_size=None)
    return a


def Predict(preprocess: Callable, args: tuple, kwargs: dict, where: str) -> dict:
    """keras.Model.predict's arguments with the inputs preprocessed."""
    a = Arguments(keras.Model.predict, args, kwargs)
    a.update(x=_Dataset(preprocess, a.get("x"), None, None, a.get("batch_size"), where))
    a["batch_size"] = None
    return a

"""Image inputs: the 8x8 handwritten digits shipped with lingpipe, and synthetic images.

`DigitsInput`: the test set of the UCI handwritten digits (Alpaydin and Kaynak,
1998; CC BY 4.0), as image batches: 1797 images of 8x8 pixels with values 0..16,
in 10 classes, read from `data/digits.csv.gz` beside this module (no download;
see data/README.md). It is the set scikit-learn's `load_digits` returns, without
scikit-learn. Pixels are scaled to [0, 1].

The split is fixed (it does not depend on `seed`): a permutation of the images by
a constant seed puts the first 10% in 'test', the next 10% in 'dev' and the rest
(80%) in 'train'.

Batch:

    images  [b, 8, 8, 1] float32 in [0, 1]
    labels  [b] int32 in 0..9

`SyntheticImageInput`: random images of a fixed shape with labels index %
num_classes, a stand-in for ImageNet where there is no reader (for throughput).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import tensorflow as tf

from lingpipe import hyperparams
from lingpipe.inputs import base_input
from lingpipe.nested_map import NestedMap

__all__ = [
    "DIGITS_FILE",
    "DigitsInput",
    "IMAGE_SHAPE",
    "LoadDigits",
    "NUM_CLASSES",
    "SplitIndices",
    "SyntheticImageInput",
]

NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8, 1)
_MAX_PIXEL = 16.0
_SPLIT_PERMUTATION_SEED = 20240917
_EVAL_FRACTION = 0.1


# One row per image: its 64 pixels row by row, then its label.
DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "digits.csv.gz")


@functools.lru_cache(maxsize=1)
def LoadDigits() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits: images [n, 8, 8, 1] float32 in [0, 1] and labels [n] int32."""
    try:
        table = np.loadtxt(DIGITS_FILE, delimiter=",", dtype=np.int32, ndmin=2)
    except (OSError, ValueError) as e:
        raise OSError(
            f"DigitsInput cannot read its data file {DIGITS_FILE} ({e}); expected the "
            "1797 UCI digits that lingpipe installs with itself: reinstall lingpipe "
            "(`pip install -e .` in a checkout)"
        ) from None
    images = (table[:, :-1].astype(np.float32) / _MAX_PIXEL).reshape((-1,) + IMAGE_SHAPE)
    return images, table[:, -1]


def SplitIndices(num_images: int, split: str) -> np.ndarray:
    """Indices, into the whole data set, of the images of `split` (sorted)."""
    order = np.random.default_rng(_SPLIT_PERMUTATION_SEED).permutation(num_images)
    num_eval = int(num_images * _EVAL_FRACTION)
    parts = {
        "test": order[:num_eval],
        "dev": order[num_eval : 2 * num_eval],
        "train": order[2 * num_eval :],
    }
    return np.sort(parts[split])


class DigitsInput(base_input.BaseInputGenerator):
    """Batches of the 8x8 UCI digits (see the module docstring).

    Batch: NestedMap(images [batch, 8, 8, 1] float32, labels [batch] int32).
    """

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        images, labels = LoadDigits()
        self._num_images = len(labels)
        indices = SplitIndices(self._num_images, self.params.split)
        self._images = tf.constant(images[indices])
        self._labels = tf.constant(labels[indices])

    @property
    def num_classes(self) -> int:
        """Number of classes: 10."""
        return NUM_CLASSES

    def NumExamples(self, split: str | None = None) -> int:
        return len(SplitIndices(self._num_images, self._CheckSplit(split)))

    def _Example(self, index: tf.Tensor) -> NestedMap:
        return NestedMap(
            images=tf.gather(self._images, index), labels=tf.gather(self._labels, index)
        )


class SyntheticImageInput(base_input.BaseInputGenerator):
    """Random images of a fixed shape with labels index % num_classes: a stand-in for data.

    Batch: NestedMap(images [b, image_size, image_size, channels] float32 in [0, 1),
    labels [b] int32). Example i of a split is the same on every run (stateless seed).
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("image_size", 224, "Height and width of the images.")
        p.Define("channels", 3, "Channels of the images.")
        p.Define("num_classes", 1000, "Labels are index % num_classes.")
        p.Define("num_examples", 1281167, "Examples per split (ImageNet's train set size).")
        return p

    def NumExamples(self, split: str | None = None) -> int:
        self._CheckSplit(split)
        return self.params.num_examples

    def _Example(self, index: tf.Tensor) -> NestedMap:
        p = self.params
        offset = base_input.SPLITS.index(p.split)
        seed = tf.stack([tf.cast(index, tf.int64), tf.constant(offset, tf.int64)])
        shape = [p.image_size, p.image_size, p.channels]
        return NestedMap(
            images=tf.random.stateless_uniform(shape, seed),
            labels=tf.cast(index % p.num_classes, tf.int32),
        )

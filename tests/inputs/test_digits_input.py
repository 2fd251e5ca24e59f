"""DigitsInput: scikit-learn's bundled 8x8 digits, split 80/10/10, static batches."""

import sys

import numpy as np
import pytest
import tensorflow as tf

sklearn_datasets = pytest.importorskip("sklearn.datasets")

from lingpipe.inputs import image  # noqa: E402


def _Input(**kwargs):
    return image.DigitsInput.Params().Set(**kwargs).Instantiate()


def test_split_sizes_disjoint_and_every_class_in_each():
    inp = _Input()
    sizes = {s: inp.NumExamples(s) for s in ("train", "dev", "test")}
    assert sizes == {"train": 1439, "dev": 179, "test": 179}
    parts = [set(image.SplitIndices(1797, s)) for s in ("train", "dev", "test")]
    assert set.union(*parts) == set(range(1797)) and sum(map(len, parts)) == 1797
    labels = sklearn_datasets.load_digits().target
    for part in parts:
        assert set(labels[sorted(part)]) == set(range(10))


def test_dev_batches_are_the_scaled_sklearn_images_in_order():
    inp = _Input(split="dev", batch_size=32)
    spec = inp.GetDataset().element_spec
    assert spec.images.shape == [32, 8, 8, 1] and spec.images.dtype == tf.float32
    assert spec.labels.shape == [32] and spec.labels.dtype == tf.int32
    batches = list(inp.Batches())
    assert len(batches) == 179 // 32  # No repeat, remainder dropped: all batches full.
    data = sklearn_datasets.load_digits()
    dev = image.SplitIndices(1797, "dev")
    for k, batch in enumerate(batches):
        rows = dev[k * 32 : (k + 1) * 32]
        np.testing.assert_array_equal(batch.images[..., 0], data.images[rows] / 16.0)
        np.testing.assert_array_equal(batch.labels, data.target[rows])
    pixels = np.concatenate([b.images for b in batches])
    assert pixels.min() == 0.0 and pixels.max() == 1.0
    assert inp.num_classes == 10


def test_train_is_deterministic_per_seed_and_shuffled():
    tf.random.set_seed(5)
    first = list(_Input(seed=3, batch_size=16).Batches(2))
    tf.random.set_seed(6)
    again = list(_Input(seed=3, batch_size=16).Batches(2))
    other = list(_Input(seed=4, batch_size=16).Batches(2))
    tf.nest.map_structure(np.testing.assert_array_equal, first, again)
    assert not np.array_equal(first[0].images, other[0].images)
    labels = np.concatenate([b.labels for b in first])
    assert labels.min() >= 0 and labels.max() <= 9 and len(set(labels)) > 5


def test_sharding_two_pipelines_is_disjoint():
    inp = _Input(split="test", batch_size=8)
    shards = []
    for k in range(2):
        context = tf.distribute.InputContext(2, k, 2)
        batches = [tf.nest.map_structure(np.asarray, b) for b in inp.GetDataset(context)]
        # 90 and 89 test examples: 22 full batches of 4 each.
        assert [b.images.shape for b in batches] == [(4, 8, 8, 1)] * 22
        shards.append({b.images[i].tobytes() for b in batches for i in range(4)})
    assert len(shards[0]) == 88 and len(shards[1]) == 88 and not shards[0] & shards[1]


def test_missing_sklearn_says_how_to_install(monkeypatch):
    image.LoadDigits.cache_clear()
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(
        ImportError,
        match=r"DigitsInput needs scikit-learn .* Install it with "
        r"`pip install scikit-learn`",
    ):
        _Input()
    monkeypatch.undo()
    image.LoadDigits.cache_clear()
    assert _Input().NumExamples() == 1439


def test_errors():
    with pytest.raises(
        ValueError,
        match=r"DigitsInput 'input': split 'dev' gives this input "
        r"pipeline 179 examples, fewer than one batch of 256",
    ):
        _Input(split="dev", batch_size=256).GetDataset()
    with pytest.raises(
        ValueError,
        match=r"expected split to be one of \['train', 'dev', "
        r"'test'\], received split='validation'",
    ):
        _Input().NumExamples("validation")

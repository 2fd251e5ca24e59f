"""DigitsInput: the UCI 8x8 digits shipped in the package, split 80/10/10, static batches."""

import csv
import gzip
import hashlib

import numpy as np
import pytest
import tensorflow as tf

from lingpipe.inputs import image

# The UCI test set's images per class, digits 0..9 (its documentation's counts).
UCI_CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def _Table():
    """The data file read with the standard library alone: pixels [n, 64], labels [n]."""
    with gzip.open(image.DIGITS_FILE, "rt") as f:
        rows = np.array([[int(x) for x in row] for row in csv.reader(f)])
    return rows[:, :-1], rows[:, -1]


def _Input(**kwargs):
    return image.DigitsInput.Params().Set(**kwargs).Instantiate()


def test_split_sizes_disjoint_and_every_class_in_each():
    inp = _Input()
    sizes = {s: inp.NumExamples(s) for s in ("train", "dev", "test")}
    assert sizes == {"train": 1439, "dev": 179, "test": 179}
    parts = [set(image.SplitIndices(1797, s)) for s in ("train", "dev", "test")]
    assert set.union(*parts) == set(range(1797)) and sum(map(len, parts)) == 1797
    _, labels = _Table()
    for part in parts:
        assert set(labels[sorted(part)]) == set(range(10))


def test_the_data_file_is_the_uci_test_set_as_shipped():
    with open(image.DIGITS_FILE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    # The file as data/README.md describes it (scikit-learn 1.9.1's copy, unchanged).
    assert digest == "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    pixels, labels = _Table()
    assert pixels.shape == (1797, 64) and pixels.min() == 0 and pixels.max() == 16
    assert np.bincount(labels).tolist() == UCI_CLASS_COUNTS
    images, got = image.LoadDigits()
    assert images.shape == (1797, 8, 8, 1) and images.dtype == np.float32
    np.testing.assert_array_equal(images.reshape(1797, 64), pixels / 16.0)
    np.testing.assert_array_equal(got, labels)


def test_dev_batches_are_the_scaled_images_in_order():
    inp = _Input(split="dev", batch_size=32)
    spec = inp.GetDataset().element_spec
    assert spec.images.shape == [32, 8, 8, 1] and spec.images.dtype == tf.float32
    assert spec.labels.shape == [32] and spec.labels.dtype == tf.int32
    batches = list(inp.Batches())
    assert len(batches) == 179 // 32  # No repeat, remainder dropped: all batches full.
    pixels, labels = _Table()
    dev = image.SplitIndices(1797, "dev")
    for k, batch in enumerate(batches):
        rows = dev[k * 32 : (k + 1) * 32]
        np.testing.assert_array_equal(batch.images[..., 0], pixels[rows].reshape(-1, 8, 8) / 16.0)
        np.testing.assert_array_equal(batch.labels, labels[rows])
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


def test_a_missing_data_file_says_what_to_do(monkeypatch, tmp_path):
    image.LoadDigits.cache_clear()
    missing = str(tmp_path / "digits.csv.gz")
    monkeypatch.setattr(image, "DIGITS_FILE", missing)
    with pytest.raises(
        OSError,
        match=rf"DigitsInput cannot read its data file {missing} \(.*\); expected the 1797 UCI "
        r"digits that lingpipe installs with itself: reinstall lingpipe",
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

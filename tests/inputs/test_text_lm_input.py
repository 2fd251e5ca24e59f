"""TextLmInput: the built-in English corpus, byte windows, splits, sharding, errors."""

import re
import zlib

import numpy as np
import pytest
import tensorflow as tf

from lingpipe.inputs import text_lm


def _Input(**kwargs):
    return text_lm.TextLmInput.Params().Set(**kwargs).Instantiate()


def _Paragraphs(count):
    """`count` paragraphs of distinct words: no 16-byte window occurs twice."""
    return [" ".join(f"w{i}.{j}" for j in range(3 + i % 5)) for i in range(count)]


def _WriteText(tmp_path, paragraphs, name="a.txt"):
    path = tmp_path / name
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


def test_built_in_corpus_is_a_megabyte_of_english_and_deterministic():
    docs = text_lm.BuiltInDocuments()
    text = b"\n".join(docs)
    assert len(text) > 1_000_000 and len(docs) > 3000
    assert text.count(b" the ") > 5000 and text.count(b" of ") > 1000
    letters = sum(c.isalpha() or c.isspace() for c in text.decode("utf-8"))
    assert letters > 0.8 * len(text)
    text_lm.BuiltInDocuments.cache_clear()
    assert text_lm.BuiltInDocuments() == docs


def test_documents_split_by_crc32():
    docs = text_lm.BuiltInDocuments()
    splits = [text_lm.SplitOf(d) for d in docs]
    for doc, split in zip(docs[:200], splits):
        bucket = zlib.crc32(doc) % 100
        assert split == ("train" if bucket < 90 else "dev" if bucket < 95 else "test")
    share = {s: splits.count(s) / len(docs) for s in ("train", "dev", "test")}
    assert 0.85 < share["train"] < 0.95 and 0.02 < share["dev"] < 0.08
    # The ids of a split: its documents as bytes + 3, each followed by EOS.
    dev_docs = [d for d in docs if text_lm.SplitOf(d) == "dev"]
    expected = np.concatenate([np.append(np.frombuffer(d, np.uint8) + 3, 2) for d in dev_docs])
    np.testing.assert_array_equal(text_lm.SplitIds(docs, "dev"), expected)


def test_batches_are_bos_shifted_windows_of_the_split():
    inp = _Input(split="dev", batch_size=4, seq_len=32)
    spec = inp.GetDataset().element_spec
    for key, dtype in [("ids", tf.int32), ("labels", tf.int32), ("paddings", tf.float32)]:
        assert spec[key].shape == [4, 32] and spec[key].dtype == dtype
    assert spec.weights.shape == [4, 32] and spec.weights.dtype == tf.float32
    ids = inp.SplitIds()
    for k, batch in enumerate(inp.Batches(3)):
        # 'dev' keeps order: window w is ids[w * 32 : (w + 1) * 32].
        expected = ids[k * 128 : (k + 1) * 128].reshape([4, 32])
        np.testing.assert_array_equal(batch.labels, expected)
        np.testing.assert_array_equal(batch.ids[:, 0], text_lm.BOS_ID)
        np.testing.assert_array_equal(batch.ids[:, 1:], batch.labels[:, :-1])
        np.testing.assert_array_equal(batch.paddings, 0.0)
        np.testing.assert_array_equal(batch.weights, 1.0)
    assert inp.vocab_size == text_lm.BYTE_VOCAB_SIZE == 259
    assert inp.NumExamples() == -(-len(ids) // 32)


def test_same_seed_same_batches_and_dev_differs_from_train():
    tf.random.set_seed(3)
    first = list(_Input(seed=1, batch_size=4).Batches(2))
    tf.random.set_seed(4)
    again = list(_Input(seed=1, batch_size=4).Batches(2))
    other = list(_Input(seed=2, batch_size=4).Batches(2))
    tf.nest.map_structure(np.testing.assert_array_equal, first, again)
    assert not np.array_equal(first[0].labels, other[0].labels)
    dev = _Input(split="dev", batch_size=4)
    assert not np.array_equal(next(dev.Batches(1)).labels, first[0].labels)
    assert not np.array_equal(dev.SplitIds("dev")[:1000], dev.SplitIds("train")[:1000])


def test_sharding_two_pipelines(tmp_path):
    _WriteText(tmp_path, _Paragraphs(300))
    inp = _Input(file_pattern=str(tmp_path / "*.txt"), batch_size=4, seq_len=16, repeat=False)
    ids = inp.SplitIds()
    padded = np.append(ids, np.zeros(-len(ids) % 16, np.int32)).reshape([-1, 16])
    windows = {tuple(r) for r in padded}
    assert len(windows) == inp.NumExamples()
    shards = []
    for k in range(2):
        context = tf.distribute.InputContext(2, k, 2)
        batches = [tf.nest.map_structure(np.asarray, b) for b in inp.GetDataset(context)]
        assert all(b.labels.shape == (2, 16) for b in batches)  # Per-replica batch.
        shards.append({tuple(r) for b in batches for r in b.labels})
    assert not shards[0] & shards[1]
    assert shards[0] | shards[1] <= windows
    # Each pipeline drops at most its last partial batch: one window of 2.
    assert len(shards[0] | shards[1]) >= len(windows) - 2


def test_files_paragraphs_and_the_padded_last_window(tmp_path):
    paragraphs = _Paragraphs(300)
    _WriteText(tmp_path, paragraphs[:150], "a.txt")
    _WriteText(tmp_path, paragraphs[150:], "b.txt")
    pattern = str(tmp_path / "*.txt")
    ids = _Input(file_pattern=pattern, split="test", seq_len=16, batch_size=1).SplitIds()
    seq_len = next(n for n in range(16, 32) if len(ids) % n)  # A partial last window.
    inp = _Input(file_pattern=pattern, split="test", batch_size=1, seq_len=seq_len)
    test_docs = [p for p in paragraphs if text_lm.SplitOf(p.encode()) == "test"]
    expected = b"".join(p.encode() + b"\xff" for p in test_docs)  # 0xff stands for EOS.
    ids = inp.SplitIds()
    np.testing.assert_array_equal(
        np.where(ids == 2, 0xFF, ids - 3), np.frombuffer(expected, np.uint8)
    )
    last = list(inp.Batches())[-1]
    real = len(ids) % seq_len
    np.testing.assert_array_equal(last.labels[0, :real], ids[-real:])
    np.testing.assert_array_equal(last.paddings[0], [0.0] * real + [1.0] * (seq_len - real))
    np.testing.assert_array_equal(last.weights[0], 1.0 - last.paddings[0])
    np.testing.assert_array_equal(last.ids[0, :real], [1, *ids[-real:-1]])
    np.testing.assert_array_equal(last.ids[0, real:], 0)
    np.testing.assert_array_equal(last.labels[0, real:], 0)


def test_unigram_entropy(tmp_path):
    _WriteText(tmp_path, _Paragraphs(200))
    inp = _Input(file_pattern=str(tmp_path / "*.txt"))
    train, dev = inp.SplitIds("train"), inp.SplitIds("dev")
    counts = {i: 1 for i in range(259)}  # Add-one smoothing.
    for i in train:
        counts[int(i)] += 1
    total = sum(counts.values())
    expected = -sum(np.log(counts[int(i)] / total) for i in dev) / len(dev)
    assert inp.UnigramEntropy("dev") == pytest.approx(expected, rel=1e-9)
    built_in = _Input(batch_size=1)
    for split in ("train", "dev", "test"):
        assert 2.5 < built_in.UnigramEntropy(split) < 5.0


def test_file_pattern_errors(tmp_path):
    pattern = str(tmp_path / "*.txt")
    escaped = re.escape(pattern)
    with pytest.raises(ValueError, match=rf"file_pattern='{escaped}' matches no files"):
        _Input(file_pattern=pattern)
    (tmp_path / "a.txt").write_text("\n\n  \n")
    with pytest.raises(
        ValueError,
        match=rf"file_pattern='{escaped}' matches 1 files, but "
        r"they hold no text",
    ):
        _Input(file_pattern=pattern)
    (tmp_path / "b.txt").mkdir()
    with pytest.raises(
        ValueError,
        match=rf"cannot read '.*b.txt' \(matched by "
        rf"file_pattern='{escaped}'\)",
    ):
        _Input(file_pattern=pattern)
    with pytest.raises(ValueError, match=r"expected file_pattern to be a str"):
        _Input(file_pattern=None)


def test_empty_split_and_small_split_errors(tmp_path):
    train_doc = next(p for p in _Paragraphs(50) if text_lm.SplitOf(p.encode()) == "train")
    _WriteText(tmp_path, [train_doc])
    pattern = str(tmp_path / "*.txt")
    with pytest.raises(
        ValueError,
        match=rf"split 'dev' of '{re.escape(pattern)}' is empty: documents go "
        r"to splits by a hash",
    ):
        _Input(file_pattern=pattern, split="dev")
    inp = _Input(file_pattern=pattern, seq_len=16, batch_size=64)
    with pytest.raises(
        ValueError,
        match=rf"split 'train' gives this input pipeline "
        rf"{inp.NumExamples()} examples, fewer than one batch of 64",
    ):
        inp.GetDataset()


def test_vocab_errors(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"vocab_size=100 cannot hold the data, whose largest "
        r"id is \d+ \(byte \d+\); expected vocab_size >= \d+",
    ):
        _Input(vocab_size=100)
    # é is bytes 0xc3 0xa9: the largest id is 0xc3 + 3 = 198, so 199 ids are enough.
    _WriteText(tmp_path, [*_Paragraphs(50), "café " * 20])
    pattern = str(tmp_path / "*.txt")
    with pytest.raises(
        ValueError,
        match=r"vocab_size=198 cannot hold the data, whose largest id is 198 \(byte 195\); "
        r"expected vocab_size >= 199",
    ):
        _Input(file_pattern=pattern, vocab_size=198)
    assert _Input(file_pattern=pattern, vocab_size=199).vocab_size == 199
    with pytest.raises(
        ValueError,
        match=r"expected seq_len to be a positive integer, "
        r"received seq_len=0",
    ):
        _Input(seq_len=0)


@pytest.mark.parametrize("split", ["train", "dev"])
def test_start_batch_resumes_the_same_stream(split):
    inp = _Input(seed=5, batch_size=4, seq_len=16, split=split, repeat=True)
    whole = [tf.nest.map_structure(np.asarray, b) for b in inp.GetDataset().take(7)]
    rest = [tf.nest.map_structure(np.asarray, b) for b in inp.GetDataset(start_batch=3).take(4)]
    tf.nest.map_structure(np.testing.assert_array_equal, whole[3:], rest)
    context = tf.distribute.InputContext(2, 1, 2)
    shard = [b.labels.numpy() for b in inp.GetDataset(context).take(5)]
    shard_rest = [b.labels.numpy() for b in inp.GetDataset(context, start_batch=2).take(3)]
    np.testing.assert_array_equal(shard[2:], shard_rest)


def test_start_batch_errors():
    with pytest.raises(ValueError, match=r"start_batch to be an integer >= 0, received .*=-1"):
        _Input().GetDataset(start_batch=-1)

"""Checkpointer: save, restore the newest readable checkpoint, fall back, fail clearly."""

import pytest
import tensorflow as tf
from absl import logging

from lingpipe.runners import checkpointer


def _Objects():
    return dict(v=tf.Variable([0.0, 0.0]), step=tf.Variable(0, dtype=tf.int64))


def _Saved(directory, steps):
    objects = _Objects()
    ckpt = checkpointer.Checkpointer(str(directory), max_to_keep=3, **objects)
    for step in steps:
        objects["v"].assign([float(step), -float(step)])
        objects["step"].assign(step)
        ckpt.Save(step)
    return ckpt


def test_restore_the_newest(tmp_path):
    _Saved(tmp_path, [1, 2, 3, 4])
    objects = _Objects()
    ckpt = checkpointer.Checkpointer(str(tmp_path), **objects)
    assert [p.rsplit("/", 1)[1] for p in ckpt.checkpoints] == ["ckpt-2", "ckpt-3", "ckpt-4"]
    assert ckpt.Restore() == str(tmp_path / "ckpt-4")
    assert objects["v"].numpy().tolist() == [4.0, -4.0] and int(objects["step"]) == 4


def test_nothing_to_restore(tmp_path):
    assert checkpointer.Checkpointer(str(tmp_path), **_Objects()).Restore() is None


@pytest.mark.parametrize("part", ["data-00000-of-00001", "index"])
def test_corrupted_newest_falls_back_with_a_warning(tmp_path, part, monkeypatch):
    _Saved(tmp_path, [1, 2, 3])
    (tmp_path / f"ckpt-3.{part}").write_bytes(b"garbage")
    warnings = []
    monkeypatch.setattr(logging, "warning", lambda msg, *a: warnings.append(msg % a))
    objects = _Objects()
    assert checkpointer.Checkpointer(str(tmp_path), **objects).Restore() == str(tmp_path / "ckpt-2")
    assert objects["v"].numpy().tolist() == [2.0, -2.0] and int(objects["step"]) == 2
    assert warnings[0].startswith(f"Checkpoint {tmp_path}/ckpt-3 cannot be read (")
    assert warnings[0].endswith(f"falling back to the one before it, {tmp_path}/ckpt-2")
    assert "instead of the newest checkpoint" in warnings[1]


def test_none_readable_names_each(tmp_path):
    _Saved(tmp_path, [1, 2])
    for step in (1, 2):
        (tmp_path / f"ckpt-{step}.index").write_bytes(b"garbage")
    with pytest.raises(checkpointer.CheckpointError, match=r"None of the 2 checkpoint\(s\)") as e:
        checkpointer.Checkpointer(str(tmp_path), **_Objects()).Restore()
    assert "ckpt-1 (" in str(e.value) and "ckpt-2 (" in str(e.value)


def test_a_checkpoint_of_another_model_is_not_restored(tmp_path):
    _Saved(tmp_path, [1])
    other = checkpointer.Checkpointer(str(tmp_path), w=tf.Variable([[1.0]]))
    with pytest.raises(checkpointer.CheckpointError, match=r"ckpt-1"):
        other.Restore()

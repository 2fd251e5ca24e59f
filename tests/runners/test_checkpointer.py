"""Checkpointer: save, restore the newest readable checkpoint, fall back, fail clearly."""

import logging as py_logging

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


@pytest.mark.parametrize("damage", ["garbage", "missing", "stale"])
def test_a_damaged_missing_or_stale_state_file_is_rebuilt_from_the_checkpoint_files(
    tmp_path, damage, monkeypatch
):
    _Saved(tmp_path, [1, 2, 3])
    state = tmp_path / "checkpoint"
    if damage == "garbage":
        state.write_text("garbage\n")
        why = f"{state} is damaged (not a checkpoint state)"
    elif damage == "missing":
        state.unlink()
        why = f"{state} is missing"
    else:  # Killed after writing ckpt-3 and before listing it.
        checkpointer.tf.__internal__.train.update_checkpoint_state(
            str(tmp_path), "ckpt-2", ["ckpt-2"], save_relative_paths=True
        )
        why = (
            f"the newest checkpoint {tmp_path}/ckpt-3 is not in checkpoint "
            "(a run killed while saving)"
        )
    warnings = []
    monkeypatch.setattr(logging, "warning", lambda msg, *a: warnings.append(msg % a))
    objects = _Objects()
    ckpt = checkpointer.Checkpointer(str(tmp_path), max_to_keep=3, **objects)
    assert warnings == [
        f"{why}; rebuilt the checkpoint list from the checkpoint files: ckpt-1, ckpt-2, ckpt-3"
    ]
    # Resumes from the newest, not from step 0 over it; the state file is whole again.
    assert ckpt.Restore() == str(tmp_path / "ckpt-3") and int(objects["step"]) == 3
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-3")
    ckpt.Save(4)
    assert [p.rsplit("/", 1)[1] for p in ckpt.checkpoints] == ["ckpt-2", "ckpt-3", "ckpt-4"]


def test_a_reader_uses_the_checkpoint_files_without_writing(tmp_path):
    _Saved(tmp_path, [1, 2])
    (tmp_path / "checkpoint").write_text("garbage\n")
    objects = _Objects()
    reader = checkpointer.Checkpointer(str(tmp_path), writable=False, **objects)
    assert reader.Restore() == str(tmp_path / "ckpt-2") and int(objects["step"]) == 2
    assert (tmp_path / "checkpoint").read_text() == "garbage\n"


def test_leftovers_of_a_killed_save_are_removed(tmp_path, monkeypatch):
    _Saved(tmp_path, [1])
    leftover = tmp_path / "ckpt-2_temp" / "part-00000-of-00001.index"
    leftover.parent.mkdir()
    leftover.write_bytes(b"half")
    lines = []
    monkeypatch.setattr(logging, "info", lambda msg, *a: lines.append(msg % a))
    checkpointer.Checkpointer(str(tmp_path), **_Objects())
    assert not leftover.parent.exists()
    assert lines == [
        f"Removing {tmp_path}/ckpt-2_temp, left by a run killed while saving a checkpoint"
    ]


def test_an_unwritable_directory_fails_in_one_line_naming_it(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    ckpt = checkpointer.Checkpointer(str(tmp_path / "checkpoints"), **_Objects())
    with pytest.raises(checkpointer.CheckpointError) as e:
        ckpt.Save(1)
    message = str(e.value)
    assert message.startswith(f"cannot write checkpoint {tmp_path}/checkpoints/ckpt-1: ")
    assert "\n" not in message and "latest: None" in message


def test_saving_does_not_log_tensorflows_sharding_line(tmp_path):
    records = []

    class Keep(py_logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=py_logging.DEBUG)
    absl_logger = logging.get_absl_logger()
    absl_logger.addHandler(handler)
    level = absl_logger.level
    absl_logger.setLevel(py_logging.DEBUG)
    try:
        _Saved(tmp_path, [1])
    finally:
        absl_logger.removeHandler(handler)
        absl_logger.setLevel(level)
    assert not [r for r in records if "Sharding callback" in r], records

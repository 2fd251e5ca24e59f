"""bench/keras_applications.py on its smallest model, in this process: the table, its
JSON, and that the pipelined VGG16 predicts as the plain one and trains."""

import json
import math

import pytest
import tensorflow as tf

from bench import keras_applications


def test_vgg16_row(tmp_path, capsys):
    out = tmp_path / "keras_applications.json"
    assert keras_applications.main(["--models=VGG16", "--in_process", f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "keras_applications: 2 stages, 2 micro-batches" in printed and f"wrote {out}" in printed
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["model"], row["input"], row["layers"]) == ("VGG16", "32x32", 23)
    assert row["predict_max_abs_diff"] < 1e-5 and math.isfinite(row["fit_loss"]), row
    # The process keeps the 8 devices tests/conftest.py asked for (run first in a fresh
    # process, an earlier version set 2, and the later tests of the process could not run).
    assert len(tf.config.list_logical_devices("CPU")) == 8


def test_an_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit) as raised:
        keras_applications.main(["--models=VGG16,ResNet"])
    assert raised.value.code == 2
    assert "expected --models from DenseNet121, " in capsys.readouterr().err

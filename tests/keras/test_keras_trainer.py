"""The trainer trains keras_models.KerasMlp, a registered model of Keras cells."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from lingpipe import model_registry


def test_registered_params_are_literal_text_of_keras_configs():
    p = model_registry.GetParams("keras_models.KerasMlp", "Train")
    text = p.ToText()
    assert "<" not in text  # nothing opaque: the trainer's params.txt reads back
    assert "'class_name': 'LayerNormalization'" in text
    back = model_registry.GetParams("keras_models.KerasMlp", "Train")
    back.cells[1].layers = []
    assert back.FromText(text).cells[1].layers == p.cells[1].layers


@pytest.mark.slow
def test_trainer_trains_the_keras_mlp_on_two_stages(tmp_path):
    logdir = str(tmp_path / "run")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lingpipe.trainer",
            "--model=keras_models.KerasMlp",
            f"--logdir={logdir}",
            "--max_steps=40",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "/device:CPU:0" in run.stderr and "/device:CPU:1" in run.stderr
    result = json.load(open(os.path.join(logdir, "eval_dev.json")))
    assert result["step"] == 40 and result["metrics"]["accuracy"] > 0.8, result
    ckpt = tf.train.latest_checkpoint(os.path.join(logdir, "checkpoints"))
    names = {n for n, _ in tf.train.list_variables(ckpt)}
    for key in ("cell_0/layer1_kernel", "cell_1/layer1_gamma", "cell_2/w"):
        assert f"task/pipeline/{key}/.ATTRIBUTES/VARIABLE_VALUE" in names, key

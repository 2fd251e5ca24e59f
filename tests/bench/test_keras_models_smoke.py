"""bench/keras_models.py's smoke run: the table, its JSON, and that the pipelined ResNet
row trained as the plain one did (same weights and data, the same last loss)."""

import json

import pytest

from bench import keras_models


def test_keras_models_smoke_table(tmp_path, capsys):
    out = tmp_path / "keras_models.json"
    assert keras_models.main(["--smoke", "--steps=2", f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    assert "smoke (one process: numbers compare nothing)" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["smoke"] and result["model"] == "resnet_blocks"
    plain, pipelined = result["rows"]
    assert plain["row"] == "resnet_blocks plain" and pipelined["row"] == "resnet_blocks K=2 M=2"
    assert plain["params_m"] == pipelined["params_m"] > 0
    for row in (plain, pipelined):
        assert row["step_ms"] > 0 and row["peak_mib"] >= row["step_peak_mib"] >= 0, row
    assert pipelined["final_loss"] == pytest.approx(plain["final_loss"], rel=1e-4)
    assert pipelined["vs_plain_time"] == pytest.approx(pipelined["step_ms"] / plain["step_ms"])
    for line in ("resnet_blocks plain", "resnet_blocks K=2 M=2"):
        assert line in printed


def test_keras_models_refuses_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as raised:
        keras_models.main(["--model=vgg"])
    assert raised.value.code == 2
    assert "expected --model resnet_blocks or resnet50, received --model=vgg" in (
        capsys.readouterr().err
    )

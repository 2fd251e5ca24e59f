"""Keras conformance: every row of tests/keras/conformance.py's table through
lingpipe.keras.Pipeline equals the plain model (fit's weights and history, evaluate,
predict) under each of its schedules, to float32 rounding or the policy's."""

import json
import os
import pathlib
import re
import subprocess
import sys

import conformance
import pytest

# A pipeline trained under mixed_bfloat16 leaves something process-wide behind that the
# conftest guard does not see (Keras' global state and policy read back unchanged): a
# float32 pipeline fit afterwards in the same process differs from its plain model by
# ~1e-3 (`pytest -n 0 "tests/keras/test_conformance.py::test_feature_equals_the_plain_
# model[mixed_bfloat16 [gpipe]]" tests/keras/test_functional_graph.py::test_shared_
# nested_model_and_shared_layer_called_twice` fails; a plain bfloat16 fit leaks nothing).
# Until that leak is found and fixed, these rows run in a process of their own so that
# the tests after them on a worker are not affected.
_OWN_PROCESS = {"mixed_bfloat16"}
_HERE = os.path.dirname(os.path.abspath(__file__))


def _CompareInOwnProcess(name, schedule, front, inference):
    code = (
        "import json, sys; from lingpipe import cluster; cluster.SetLogicalCpuDevices(8); "
        "import conformance; n, s, f, i = json.loads(sys.argv[1]); "
        "print(json.dumps(conformance.Compare(conformance.FEATURES[n], s, f, i)))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_HERE, os.environ.get("PYTHONPATH", "")]))
    args = json.dumps([name, schedule, front, inference])
    done = subprocess.run(
        [sys.executable, "-c", code, args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CASES = [
    pytest.param(name, schedule, "Pipeline", id=f"{name} [{schedule}]")
    for name, feature in conformance.FEATURES.items()
    for schedule in feature.schedules
] + [
    pytest.param(name, "1f1b", "PipelinedSequential", id=f"{name} [PipelinedSequential]")
    for name, feature in conformance.FEATURES.items()
    if feature.sequential
]


@pytest.mark.parametrize("name,schedule,front", CASES)
def test_feature_equals_the_plain_model(name, schedule, front):
    feature = conformance.FEATURES[name]
    # The schedule orders training only: evaluate and predict run one forward-only order,
    # checked under gpipe (and through PipelinedSequential).
    inference = schedule == "gpipe" or front != "Pipeline"
    if name in _OWN_PROCESS:
        figures = _CompareInOwnProcess(name, schedule, front, inference)
    else:
        figures = conformance.Compare(feature, schedule, front, inference)
    worst = max(figures.values())
    assert worst <= feature.tolerance, f"{name} under {schedule} ({front}): {figures}"


@pytest.mark.parametrize("what", list(conformance.REFUSALS))
def test_refused_in_one_line_before_training(what):
    error, pattern = conformance.REFUSALS[what]
    with pytest.raises(error) as raised:
        conformance.Refuse(what)
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(raised.value)).strip()
    assert "\n" not in message, message
    assert re.search(pattern, message), message


def _Listed(readme: str, block: str) -> list[str]:
    start, end = f"<!-- conformance:{block} -->", f"<!-- /conformance:{block} -->"
    text = readme.split(start, 1)[1].split(end, 1)[0]
    return [line[2:] for line in text.strip().splitlines()]


def test_keras_guide_lists_exactly_the_table():
    guide = (pathlib.Path(__file__).parents[2] / "docs" / "keras.md").read_text()
    assert _Listed(guide, "features") == list(conformance.FEATURES)
    assert _Listed(guide, "refusals") == list(conformance.REFUSALS)

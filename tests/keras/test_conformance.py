"""Keras conformance: every row of tests/keras/conformance.py's table through
lingpipe.keras.Pipeline equals the plain model (fit's weights and history, evaluate,
predict) under each of its schedules, to float32 rounding or the policy's."""

import pathlib
import re

import conformance
import pytest

# 1F1B interleaves forwards and backwards as zbv does, which also splits the backward and
# places stages in a V: under 1F1B a feature is a further proof (extended), not a new one.
CASES = [
    pytest.param(
        name,
        schedule,
        "Pipeline",
        id=f"{name} [{schedule}]",
        marks=[pytest.mark.extended] if schedule == "1f1b" and len(feature.schedules) > 2 else [],
    )
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

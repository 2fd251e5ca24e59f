"""The installed package's metadata: what `pip show` and PyPI users read.

Read from the installed distribution (`pip install -e ".[test]"` writes it from
pyproject.toml), so a change to pyproject.toml shows here after reinstalling.
"""

import importlib.metadata
import os

import lingpipe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _Requirements() -> set[str]:
    """Names of the runtime requirements (those without an `extra ==` marker)."""
    names = set()
    for requirement in importlib.metadata.requires("lingpipe") or []:
        if "extra ==" not in requirement:
            names.add(requirement.split(";")[0].split(">")[0].split("=")[0].strip().lower())
    return names


def test_one_version_source():
    assert importlib.metadata.version("lingpipe") == lingpipe.__version__


def test_license_is_apache_2_with_its_full_text():
    metadata = importlib.metadata.metadata("lingpipe")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in metadata.get_all("License-File")
    with open(os.path.join(REPO, "LICENSE")) as f:
        text = f.read()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # The full text, not a header.


def test_classifiers_and_long_description():
    metadata = importlib.metadata.metadata("lingpipe")
    classifiers = metadata.get_all("Classifier")
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().startswith("# lingpipe")  # README.md


def test_every_runtime_dependency_is_declared():
    # matplotlib: the pictures of schedules and timelines.
    expected = {"tensorflow", "keras", "numpy", "absl-py", "matplotlib"}
    assert expected <= _Requirements()
    # Not scikit-learn: the digits ship in the package, and Keras imports scikit-learn
    # (and scipy.stats) into every `import tensorflow` where it is installed, 0.55 s each.
    assert "scikit-learn" not in _Requirements()


def test_the_trainer_command_is_installed():
    scripts = importlib.metadata.entry_points(group="console_scripts")
    (trainer,) = [s for s in scripts if s.name == "lingpipe-trainer"]
    assert trainer.value == "lingpipe.trainer:Run"

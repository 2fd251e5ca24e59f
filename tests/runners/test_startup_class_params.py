"""Class-valued params from the trainer's --params_override and --params_file.

Text from the command line or a file may name only subclasses of what the field
expects: `cls : subprocess.Popen` is refused before anything is built.
"""

import subprocess  # noqa: F401  Imported, so that the override's class resolves.

import pytest

from lingpipe.runners import startup

LM = "lm.TransformerLmTiny"
POPEN_MESSAGE = (
    "train.lr_schedule.cls: expected a subclass of lingpipe.lr_schedules.BaseSchedule, "
    "received subprocess.Popen"
)


def test_override_naming_an_unrelated_class_is_a_usage_error():
    overrides = startup.Overrides(params_override="train.lr_schedule.cls : subprocess.Popen")
    with pytest.raises(startup.UsageError) as info:
        startup.ResolveParams(LM, overrides)
    message = str(info.value)
    assert message.startswith("--params_override: cannot apply")
    assert message.endswith(POPEN_MESSAGE)
    assert "\n" not in message


def test_params_file_naming_an_unrelated_class_is_a_usage_error(tmp_path):
    params_file = tmp_path / "p.txt"
    params_file.write_text("model_dims : 32\ntrain.lr_schedule.cls : subprocess.Popen\n")
    overrides = startup.Overrides(params_file=str(params_file))
    with pytest.raises(startup.UsageError) as info:
        startup.ResolveParams(LM, overrides)
    assert str(info.value).startswith(f"--params_file={params_file}: cannot apply")
    assert str(info.value).endswith(POPEN_MESSAGE)


def test_override_naming_a_subclass_of_the_fields_base_is_accepted():
    overrides = startup.Overrides(
        params_override="train.lr_schedule.cls : lingpipe.lr_schedules.Constant; "
        "train.optimizer.cls : lingpipe.optimizers.SGD"
    )
    p = startup.ResolveParams(LM, overrides).task
    assert (p.train.lr_schedule.cls.__name__, p.train.optimizer.cls.__name__) == (
        "Constant",
        "SGD",
    )

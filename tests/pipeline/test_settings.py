"""The pipeline settings are declared once (lingpipe.pipeline.step.settings): every front end
has the same names, defaults and doc lines, and the schedules come from the registry."""

import inspect

import pytest

from lingpipe import hyperparams, trainer
from lingpipe.keras import functional, graph_pipeline, sequential
from lingpipe.layers import gpipe
from lingpipe.models import base_task
from lingpipe.pipeline.schedules import generators
from lingpipe.pipeline.step import settings
from lingpipe.runners import startup


@pytest.mark.parametrize(
    "constructor",
    [
        functional.Pipeline.__init__,
        sequential.PipelinedSequential.__init__,
        graph_pipeline.GraphPipeline.__init__,
    ],
    ids=["Pipeline", "PipelinedSequential", "GraphPipeline"],
)
def test_keras_constructors_default_to_the_settings(constructor):
    parameters = inspect.signature(constructor).parameters
    shared = [s for s in settings.SETTINGS if s.name in parameters]
    assert {s.name for s in shared} >= {
        "num_stages",
        "num_micro_batches",
        "schedule",
        "remat",
        "partition",
        "devices",
        "num_virtual_stages",
    }
    for s in shared:
        assert parameters[s.name].default == s.default, s.name


@pytest.mark.parametrize("cls", [functional.Pipeline, sequential.PipelinedSequential])
def test_keras_docstrings_carry_each_settings_doc_line(cls):
    for name in ("num_stages", "num_micro_batches", "schedule", "remat", "partition"):
        assert settings.Get(name).doc in " ".join(cls.__doc__.split()), name


@pytest.mark.parametrize(
    "params, names",
    [
        (gpipe.PipeliningLayer.Params(), [s.name for s in settings.SETTINGS]),
        (base_task.DefinePipelineParams(hyperparams.Params()), settings.TASK),
    ],
    ids=["PipeliningLayer", "task"],
)
def test_params_define_each_setting_with_its_default_and_doc(params, names):
    for name in names:
        s = settings.Get(name)
        assert params.Get(name) == s.default, name
        assert params._params[name].description == s.doc, name  # noqa: SLF001


def test_the_schedules_are_the_registrys_and_the_flags_list_them():
    assert settings.Get("schedule").choices == generators.TRAINING
    assert "forward_only" not in generators.TRAINING
    assert set(generators.TRAINING) | {"forward_only"} == set(generators.SCHEDULES)
    help_text = " ".join(trainer.FLAGS["schedule"].help.split())
    for name in generators.TRAINING:
        assert f"{name}," in help_text or f"{name} (" in help_text, name
    listed = {f.name for f in trainer.FLAGS.get_key_flags_for_module(trainer.__name__)}
    assert set(settings.FLAGS) | {"plan", "memory_per_device"} <= listed  # --help shows them
    for name in settings.FLAGS:
        assert " ".join(trainer.FLAGS[name].help.split()).startswith(settings.Get(name).doc)
        assert trainer.FLAGS[name].default is None  # not given: the task's value


def test_partition_and_remat_lists_from_text():
    p = startup.ResolveParams(
        "lm.TransformerLmTiny",
        startup.Overrides(
            params_override="partition : [3, 1]; remat : ['never', 'always']", num_stages=2
        ),
    ).task
    assert p.partition == [3, 1] and p.remat == ["never", "always"]
    p = startup.ResolveParams(
        "lm.TransformerLmTiny",
        startup.Overrides(num_stages=2, partition="1,3", remat="[never, always]"),
    ).task
    assert p.partition == [1, 3] and p.remat == ["never", "always"]


@pytest.mark.parametrize(
    "name, text, value",
    [
        ("partition", "[2, 3]", [2, 3]),
        ("partition", "2,3", [2, 3]),
        # One stage: what the planner writes for a plan without a pipeline (K=1).
        ("partition", "4", [4]),
        ("partition", "[4]", [4]),
        ("partition", "flops", "flops"),
        ("remat", "never", "never"),
        ("remat", "always,never", ["always", "never"]),
        ("remat", "['always', 'never']", ["always", "never"]),
        ("num_stages", "4", 4),
        ("schedule", "v_half", "v_half"),
    ],
)
def test_flag_text(name, text, value):
    assert settings.FromText(name, text) == value


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("partition", "flop", "--partition=flop: expected one of uniform, flops, params, profile"),
        ("partition", "2,0", "--partition=2,0: expected a list of positive counts per stage"),
        ("remat", "sometimes", "--remat=sometimes: expected one of always, except_last, never"),
        ("num_stages", "two", "--num_stages=two: expected a positive integer, received 'two'"),
        ("schedule", "gpip", "--schedule=gpip: expected one of gpipe, 1f1b,"),
    ],
)
def test_bad_flag_text_says_what_is_expected(name, text, message):
    with pytest.raises(ValueError) as e:
        settings.FromText(name, text)
    assert message in str(e.value)

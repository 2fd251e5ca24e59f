"""A test-only model family, imported as `lingpipe.params.testfam` by tests/test_model_registry.py.

The tests put this folder on `lingpipe.params.__path__`, so `GetParams('testfam.TinyModel',
...)` imports it on demand exactly as it imports lingpipe/params/lm.py. Never imported
otherwise.
"""

from lingpipe import hyperparams, model_registry
from lingpipe.models import base_model_params


class FakeInput:
    """Stands in for an input generator: only its params matter here."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = hyperparams.InstantiableParams(cls)
        p.Define("split", "train", "Which part of the data: 'train', 'dev' or 'test'.")
        p.Define("batch_size", 8, "Examples per batch.")
        return p


class FakeTask:
    """Stands in for a BaseTask: its params have `input`."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = hyperparams.InstantiableParams(cls)
        p.Define("name", "fake", "Name of the task.")
        p.Define("input", None, "Input params, set by model_registry.GetParams.")
        p.Define("model_dims", 4, "Model dimension.")
        return p


@model_registry.RegisterSingleTaskModel
class TinyModel(base_model_params.SingleTaskModelParams):
    """Uses the default Dev() and Test(): Train() with `split` changed."""

    def Train(self) -> hyperparams.InstantiableParams:
        return FakeInput.Params().Set(batch_size=16)

    def Task(self) -> hyperparams.InstantiableParams:
        return FakeTask.Params().Set(model_dims=32)


@model_registry.RegisterSingleTaskModel
class TinyModelWithDevOther(TinyModel):
    """Overrides Dev() and adds a dataset of its own."""

    def Dev(self) -> hyperparams.InstantiableParams:
        return FakeInput.Params().Set(split="dev", batch_size=4)

    def DevOther(self) -> hyperparams.InstantiableParams:
        return FakeInput.Params().Set(split="dev_other", batch_size=2)


@model_registry.RegisterSingleTaskModel
class NoSplitModel(TinyModel):
    """Train() params without `split`, so the default Dev() cannot derive from them."""

    def Train(self) -> hyperparams.InstantiableParams:
        p = hyperparams.InstantiableParams(FakeInput)
        p.Define("batch_size", 8, "Examples per batch.")
        return p


@model_registry.RegisterSingleTaskModel
class NoInputTaskModel(TinyModel):
    """Task() returns params that have no `input`."""

    def Task(self) -> hyperparams.InstantiableParams:
        p = hyperparams.InstantiableParams(FakeTask)
        p.Define("model_dims", 4, "Model dimension.")
        return p

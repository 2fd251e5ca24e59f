"""SingleTaskModelParams: a registered model is a class that says what to train on what.

As in Lingvo, a model is declared by a class in a module of the top-level `params`
package, registered with `model_registry.RegisterSingleTaskModel`:

    @model_registry.RegisterSingleTaskModel
    class TransformerLmTiny(base_model_params.SingleTaskModelParams):

      def Train(self):
        return my_input.LmInput.Params().Set(split='train', batch_size=32)

      def Task(self):
        p = lm.LanguageModel.Params().Set(name='lm', model_dims=64)
        p.train.learning_rate = 1e-3
        return p

`Train()`, `Dev()` and `Test()` give the input params of each dataset; `Task()` gives
the task params (a `BaseTask.Params()`), without its `input`, which
`model_registry.GetParams(key, dataset)` fills in with the dataset's. By default
`Dev()` and `Test()` are `Train()` with its `split` param set to 'dev' and 'test'.

A class may define more datasets: every public method whose name starts with an
upper-case letter, other than `Task` and `Datasets`, is one (e.g. `DevOther`).
"""

from __future__ import annotations

from lingpipe import hyperparams

__all__ = [
    "SingleTaskModelParams",
]

# Public upper-case methods that are not datasets.
_NOT_DATASETS = frozenset({"Task", "Datasets"})


class SingleTaskModelParams:
    """The params of one task and of the inputs of its datasets (see the module docstring)."""

    def Train(self) -> hyperparams.InstantiableParams:
        """Input params of the training data."""
        raise TypeError(
            f"{type(self).__name__} must define Train(self), returning the input params "
            "of the training data"
        )

    def _TrainWithSplit(self, split: str) -> hyperparams.InstantiableParams:
        p = self.Train()
        if not isinstance(p, hyperparams.Params) or "split" not in p:
            raise ValueError(
                f"{type(self).__name__}: the default {split.capitalize()}() sets `split` "
                f"on the params of Train(), but they have no `split` param (received "
                f"{type(p).__name__}); define {split.capitalize()}(self) in the class"
            )
        p.split = split
        return p

    def Dev(self) -> hyperparams.InstantiableParams:
        """Input params of the development data: by default Train()'s with split='dev'."""
        return self._TrainWithSplit("dev")

    def Test(self) -> hyperparams.InstantiableParams:
        """Input params of the test data: by default Train()'s with split='test'."""
        return self._TrainWithSplit("test")

    def Task(self) -> hyperparams.InstantiableParams:
        """Params of the task (a `base_task.BaseTask` subclass); `input` is set by GetParams."""
        raise TypeError(
            f"{type(self).__name__} must define Task(self), returning the task params "
            "(SomeTask.Params())"
        )

    @classmethod
    def Datasets(cls) -> list[str]:
        """Sorted names of the dataset methods: ['Dev', 'Test', 'Train'] and any added."""
        return sorted(
            name
            for name in dir(cls)
            if name[:1].isupper() and name not in _NOT_DATASETS and callable(getattr(cls, name))
        )

"""The model registry: named model params classes, looked up by key as Lingvo does.

A model params class lives in a module of a `params` package, one module per model
family, and registers itself with a decorator:

    # lingpipe/params/lm.py
    @model_registry.RegisterSingleTaskModel
    class TransformerLmTiny(base_model_params.SingleTaskModelParams):
      ...

Its key is the module path after the package and the class name: 'lm.TransformerLmTiny'
(a class in params/mt/wmt.py is 'mt.wmt.Foo'). `GetParams(key, dataset)` imports the
family's module on demand, so the trainer needs no list of imports:

    p = model_registry.GetParams('lm.TransformerLmTiny', 'Train')  # task params
    p.input                       # the input params of the class's Train()
    task = p.Instantiate()

lingpipe's own families are the package `lingpipe.params`. Your own models: write a
top-level `params` package (a folder `params/` with an `__init__.py` and one module per
family, e.g. `params/mymodels.py` registering `MyLm`, key 'mymodels.MyLm') in the
directory you run `python -m lingpipe.trainer` from, or in a directory on PYTHONPATH
(the `lingpipe-trainer` command does not search the working directory, as Python never
does for installed commands). Both packages are searched, lingpipe's first, so
lingpipe's families always resolve and cannot be replaced, yours resolve beside them,
and your modules may import ours (`from lingpipe.params import lm`) to derive from
them. A family module of yours named like one of ours (an `lm` module) is an error
that names both files.

Errors name what was asked for and what exists: an unknown key lists close matches
and the family's registered keys, an unknown family the modules of both packages, an
unknown dataset the class's datasets.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import types

from lingpipe import hyperparams
from lingpipe.models import base_model_params

__all__ = ["GetClass", "GetParams", "ListKeys", "RegisterSingleTaskModel"]

# Where families live, searched in this order: lingpipe's own, then a user's own.
_BUILTIN = "lingpipe.params"
_USER = "params"
_PACKAGES = (_BUILTIN, _USER)

# Registered classes by key, e.g. {'lm.TransformerLmTiny': TransformerLmTiny}.
_MODELS: dict[str, type] = {}


def _Family(key: str) -> str:
    """'lm' of 'lm.TransformerLmTiny', 'mt.wmt' of 'mt.wmt.Foo'."""
    return key.rpartition(".")[0]


def _KeyOf(cls: type) -> str:
    module = cls.__module__
    for package in _PACKAGES:
        if module.startswith(package + "."):
            return f"{module[len(package) + 1 :]}.{cls.__name__}"
    raise ValueError(
        f"RegisterSingleTaskModel: {cls.__name__} is defined in module {module!r}; "
        f"registered model params must live in a module of lingpipe.params or of a "
        f"top-level {_USER!r} package (e.g. {_USER}/mymodels.py, key "
        f"'mymodels.{cls.__name__}')"
    )


def RegisterSingleTaskModel(cls: type) -> type:
    """Class decorator: registers a SingleTaskModelParams subclass under its key.

    Returns the class unchanged. Registering the same class again is a no-op;
    another class under an existing key is an error.

    Raises:
      TypeError: `cls` is not a SingleTaskModelParams subclass.
      ValueError: `cls` is not in a module of a `params` package, or its key is taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, base_model_params.SingleTaskModelParams)):
        raise TypeError(
            "RegisterSingleTaskModel expects a subclass of "
            f"base_model_params.SingleTaskModelParams, received {cls!r}"
        )
    key = _KeyOf(cls)
    existing = _MODELS.get(key)
    if existing is not None and existing is not cls:
        raise ValueError(
            f"RegisterSingleTaskModel: model {key!r} is already registered (by "
            f"{existing.__module__}.{existing.__qualname__}); give the class another name"
        )
    _MODELS[key] = cls
    return cls


def _Packages() -> list[types.ModuleType]:
    """lingpipe.params, and a user's top-level `params` package when Python finds one."""
    found = [importlib.import_module(_BUILTIN)]
    try:
        found.append(importlib.import_module(_USER))
    except ModuleNotFoundError as e:
        if e.name != _USER:  # A missing import inside the user's package is its error.
            raise
    return found


def _FamilyFile(top: str, package: types.ModuleType) -> str | None:
    """The file or folder of module `top` in `package`'s directories, if any."""
    for directory in package.__path__:
        for candidate in (os.path.join(directory, f"{top}.py"), os.path.join(directory, top)):
            if os.path.isfile(candidate) or os.path.isfile(os.path.join(candidate, "__init__.py")):
                return candidate
    return None


def _PackageOf(family: str) -> str | None:
    """The package whose module holds `family` ('lm', 'mt.wmt'); None if neither does.

    Raises:
      ValueError: the family's top module is in both packages.
    """
    top = family.split(".")[0]
    found = [(p.__name__, _FamilyFile(top, p)) for p in _Packages()]
    found = [(name, path) for name, path in found if path is not None]
    if len(found) > 1 and os.path.realpath(found[0][1]) != os.path.realpath(found[1][1]):
        raise ValueError(
            f"Model family {top!r} is defined twice: {found[0][1]} and {found[1][1]}; only "
            "the first is read, so rename the other module (a family's keys are "
            "'<module>.<ClassName>')"
        )
    return found[0][0] if found else None


def _FamilyModules() -> list[str]:
    """Names of the families in both packages: their modules, 'lm', 'mt.wmt', ..."""
    names = set()
    for package in _Packages():
        prefix = package.__name__ + "."
        for info in pkgutil.walk_packages(package.__path__, prefix=prefix):
            names.add(info.name[len(prefix) :])
    return sorted(names)


def _ImportFamily(family: str, key: str | None = None) -> None:
    """Imports <package>.<family>, which registers its classes."""
    package = _PackageOf(family) or _BUILTIN
    module = f"{package}.{family}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        # Only a missing family module is the user's typo; a missing import inside
        # an existing family module is that module's error.
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise
        asked = f" in model {key!r}" if key is not None else ""
        known = _FamilyModules()
        close = difflib.get_close_matches(family, known)
        hint = f" Did you mean: {close}?" if close else ""
        raise ValueError(
            f"Unknown model family {family!r}{asked}: there is no module "
            f"{_BUILTIN}.{family} or {_USER}.{family}.{hint} Known families: "
            f"{known}{_UnsearchedHint()}"
        ) from None


def _UnsearchedHint() -> str:
    """A note when the working directory has a `params/` that is not searched."""
    local = os.path.realpath(_USER)
    if not os.path.isdir(local):
        return ""
    if any(os.path.realpath(d) == local for p in _Packages() for d in p.__path__):
        return ""
    return (
        f". {local} is not searched: run python -m lingpipe.trainer from "
        f"{os.path.dirname(local)}, or put that directory on PYTHONPATH"
    )


def GetClass(key: str) -> type:
    """The SingleTaskModelParams subclass registered as `key`, importing its family.

    Raises:
      ValueError: `key` is malformed, its family module does not exist, or the
        family has no such class (with close matches and the family's keys).
    """
    if not isinstance(key, str) or not _Family(key) or not key.rpartition(".")[2]:
        raise ValueError(
            f"Received an invalid model key {key!r}, expected '<family>.<ClassName>' "
            "(e.g. 'lm.TransformerLmTiny')"
        )
    if key in _MODELS:
        return _MODELS[key]
    family = _Family(key)
    _ImportFamily(family, key)
    if key in _MODELS:
        return _MODELS[key]
    # Class names only: the family prefix they share would make every key look close.
    in_family = sorted(k for k in _MODELS if _Family(k) == family)
    names = [k.rpartition(".")[2] for k in in_family]
    close = [f"{family}.{n}" for n in difflib.get_close_matches(key.rpartition(".")[2], names)]
    message = f"Unknown model {key!r}."
    if close:
        message += f" Did you mean: {close}?"
    message += f" Models registered in family {family!r}: {in_family}"
    raise ValueError(message)


def ListKeys(family: str | None = None) -> list[str]:
    """Sorted registered keys, of one family or (importing every family module) of all."""
    for name in [family] if family is not None else _FamilyModules():
        _ImportFamily(name)
    return sorted(k for k in _MODELS if family is None or _Family(k) == family)


def _DatasetMethod(cls: type, key: str, dataset: str) -> str:
    """The name of `cls`'s dataset method matching `dataset` case-insensitively."""
    datasets = cls.Datasets()
    if dataset in datasets:
        return dataset
    matches = [d for d in datasets if isinstance(dataset, str) and d.lower() == dataset.lower()]
    if len(matches) != 1:
        raise ValueError(
            f"Model {key!r} has no dataset {dataset!r}; expected one of {datasets} "
            "(case-insensitive)"
        )
    return matches[0]


def GetParams(key: str, dataset: str) -> hyperparams.InstantiableParams:
    """The task params of model `key`, with `input` set to `dataset`'s input params.

    Args:
      key: '<family>.<ClassName>', e.g. 'lm.TransformerLmTiny'.
      dataset: 'Train', 'Dev', 'Test' (any case), or another dataset method of the class.

    Raises:
      ValueError: unknown key, family or dataset, or Task() gives params without `input`.
    """
    cls = GetClass(key)
    method = _DatasetMethod(cls, key, dataset)
    model = cls()
    task_params = model.Task()
    if not isinstance(task_params, hyperparams.InstantiableParams) or "input" not in task_params:
        raise ValueError(
            f"Model {key!r}: Task() must return task params with an `input` param "
            f"(from a BaseTask subclass's Params()), received {type(task_params).__name__}"
            + (
                f" for {task_params.cls!r}"
                if isinstance(task_params, hyperparams.InstantiableParams)
                else ""
            )
        )
    task_params.input = getattr(model, method)()
    return task_params

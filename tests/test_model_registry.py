"""model_registry: keys, on-demand import of families, datasets, and every error."""

import os
import subprocess
import sys
import types

import pytest

from lingpipe import model_registry, params
from lingpipe.models import base_model_params

FAMILY_DIR = os.path.join(os.path.dirname(__file__), "registry_params")
TINY_KEYS = [
    "testfam.NoInputTaskModel",
    "testfam.NoSplitModel",
    "testfam.TinyModel",
    "testfam.TinyModelWithDevOther",
]


def _ParamsModules() -> dict:
    """Every imported module of lingpipe.params and of a top-level `params` package."""
    return {
        k: v
        for k, v in sys.modules.items()
        if k in ("params", "lingpipe.params") or k.startswith(("params.", "lingpipe.params."))
    }


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    """An empty registry, and tests/registry_params/ as part of lingpipe.params.

    Family modules imported here register into this empty registry only, so they are
    forgotten afterwards: a later test importing them again registers their classes.
    """
    monkeypatch.setattr(model_registry, "_MODELS", {})
    monkeypatch.setattr(params, "__path__", [*params.__path__, FAMILY_DIR])
    saved = _ParamsModules()
    # Families an earlier test imported are imported afresh here, so that they register
    # into the empty registry (a cached module would register nothing).
    for name in saved:
        if name.startswith(("params.", "lingpipe.params.")):
            del sys.modules[name]
    yield
    for name in _ParamsModules():
        if name not in saved:
            del sys.modules[name]
            if name.startswith("lingpipe.params."):
                params.__dict__.pop(name.split(".")[2], None)
    sys.modules.update(saved)
    for name, module in saved.items():
        if name.count(".") == 2 and name.startswith("lingpipe.params."):
            setattr(params, name.split(".")[2], module)


def _ClassIn(module: str, name: str) -> type:
    return type(name, (base_model_params.SingleTaskModelParams,), {"__module__": module})


def test_get_params_imports_the_family_and_sets_the_train_input():
    assert "lingpipe.params.testfam" not in sys.modules
    p = model_registry.GetParams("testfam.TinyModel", "Train")
    assert "lingpipe.params.testfam" in sys.modules
    testfam = sys.modules["lingpipe.params.testfam"]
    assert p.cls is testfam.FakeTask
    assert p.model_dims == 32
    assert p.input.cls is testfam.FakeInput
    assert (p.input.split, p.input.batch_size) == ("train", 16)


@pytest.mark.parametrize(
    "dataset, split", [("Dev", "dev"), ("dev", "dev"), ("TEST", "test"), ("train", "train")]
)
def test_default_dev_and_test_are_train_with_split_changed(dataset, split):
    p = model_registry.GetParams("testfam.TinyModel", dataset)
    assert (p.input.split, p.input.batch_size) == (split, 16)


def test_a_class_overrides_dev_and_adds_datasets():
    key = "testfam.TinyModelWithDevOther"
    assert model_registry.GetParams(key, "Dev").input.batch_size == 4
    assert model_registry.GetParams(key, "devother").input.split == "dev_other"
    assert model_registry.GetParams(key, "Test").input.split == "test"
    assert model_registry.GetClass(key).Datasets() == ["Dev", "DevOther", "Test", "Train"]


def test_each_call_gives_fresh_params():
    a = model_registry.GetParams("testfam.TinyModel", "Train")
    a.input.batch_size = 1
    assert model_registry.GetParams("testfam.TinyModel", "Train").input.batch_size == 16


def test_get_class_and_list_keys():
    cls = model_registry.GetClass("testfam.TinyModel")
    assert cls is sys.modules["lingpipe.params.testfam"].TinyModel
    assert model_registry.ListKeys("testfam") == TINY_KEYS
    assert set(TINY_KEYS) <= set(model_registry.ListKeys())


def test_unknown_key_lists_close_matches_and_the_family():
    with pytest.raises(ValueError) as e:
        model_registry.GetParams("testfam.TinyModle", "Train")
    assert str(e.value) == (
        "Unknown model 'testfam.TinyModle'. Did you mean: ['testfam.TinyModel']? "
        f"Models registered in family 'testfam': {TINY_KEYS}"
    )


def test_unknown_key_without_close_matches_still_lists_the_family():
    with pytest.raises(ValueError, match=r"^Unknown model 'testfam.Xyz'\. Models registered in"):
        model_registry.GetClass("testfam.Xyz")


def test_unknown_family():
    with pytest.raises(ValueError) as e:
        model_registry.GetParams("nofam.TinyModel", "Train")
    message = str(e.value)
    assert message.startswith(
        "Unknown model family 'nofam' in model 'nofam.TinyModel': there is no module "
        "lingpipe.params.nofam or params.nofam. Known families: ["
    )
    assert "'testfam'" in message


def test_unknown_family_suggests_close_families():
    with pytest.raises(ValueError) as e:
        model_registry.ListKeys("testfan")
    assert str(e.value).startswith(
        "Unknown model family 'testfan': there is no module lingpipe.params.testfan or "
        "params.testfan. Did you mean: ['testfam']? Known families: ["
    )


def test_an_import_error_inside_a_family_module_is_not_hidden(tmp_path, monkeypatch):
    (tmp_path / "brokenfam.py").write_text("import no_such_module_for_lingpipe_tests\n")
    monkeypatch.setattr(params, "__path__", [*params.__path__, str(tmp_path)])
    with pytest.raises(ModuleNotFoundError, match="no_such_module_for_lingpipe_tests"):
        model_registry.GetClass("brokenfam.Anything")


@pytest.mark.parametrize("key", ["TinyModel", ".TinyModel", "testfam.", 3])
def test_malformed_key(key):
    with pytest.raises(ValueError, match=r"invalid model key .*expected '<family>\.<ClassName>'"):
        model_registry.GetClass(key)


def test_a_dataset_the_class_lacks():
    with pytest.raises(ValueError) as e:
        model_registry.GetParams("testfam.TinyModel", "Eval")
    assert str(e.value) == (
        "Model 'testfam.TinyModel' has no dataset 'Eval'; expected one of "
        "['Dev', 'Test', 'Train'] (case-insensitive)"
    )


def test_default_dev_needs_a_split_param():
    assert model_registry.GetParams("testfam.NoSplitModel", "Train").input.batch_size == 8
    with pytest.raises(ValueError, match=r"NoSplitModel: the default Dev\(\) sets `split`.*"):
        model_registry.GetParams("testfam.NoSplitModel", "Dev")


def test_task_params_need_an_input_param():
    with pytest.raises(ValueError) as e:
        model_registry.GetParams("testfam.NoInputTaskModel", "Train")
    assert str(e.value).startswith(
        "Model 'testfam.NoInputTaskModel': Task() must return task params with an `input` "
        "param (from a BaseTask subclass's Params()), received InstantiableParams for <class"
    )


def test_registering_a_key_twice():
    first = model_registry.RegisterSingleTaskModel(_ClassIn("params.otherfam", "Twice"))
    assert model_registry.RegisterSingleTaskModel(first) is first  # Same class: a no-op.
    assert model_registry.GetClass("otherfam.Twice") is first
    with pytest.raises(ValueError) as e:
        model_registry.RegisterSingleTaskModel(_ClassIn("params.otherfam", "Twice"))
    assert str(e.value) == (
        "RegisterSingleTaskModel: model 'otherfam.Twice' is already registered (by "
        "params.otherfam.Twice); give the class another name"
    )


def test_nested_family_modules_make_dotted_keys():
    cls = model_registry.RegisterSingleTaskModel(_ClassIn("lingpipe.params.mt.wmt", "Big"))
    assert model_registry.GetClass("mt.wmt.Big") is cls


def test_only_classes_under_params_register():
    with pytest.raises(ValueError) as e:
        model_registry.RegisterSingleTaskModel(_ClassIn("my_models", "Outside"))
    assert str(e.value) == (
        "RegisterSingleTaskModel: Outside is defined in module 'my_models'; registered "
        "model params must live in a module of lingpipe.params or of a top-level 'params' "
        "package (e.g. params/mymodels.py, key 'mymodels.Outside')"
    )


def test_lingpipe_params_and_a_users_params_give_the_same_keys():
    ours = model_registry.RegisterSingleTaskModel(_ClassIn("lingpipe.params.ourfam", "A"))
    theirs = model_registry.RegisterSingleTaskModel(_ClassIn("params.theirfam", "B"))
    assert model_registry.GetClass("ourfam.A") is ours
    assert model_registry.GetClass("theirfam.B") is theirs


def test_only_single_task_model_params_register():
    with pytest.raises(TypeError, match=r"expects a subclass of .*SingleTaskModelParams, rec"):
        model_registry.RegisterSingleTaskModel(type("Plain", (), {"__module__": "params.x"}))


def test_train_and_task_must_be_defined():
    bare = _ClassIn("params.otherfam", "Bare")()
    with pytest.raises(TypeError, match=r"^Bare must define Train\(self\), returning the input"):
        bare.Train()
    with pytest.raises(TypeError, match=r"^Bare must define Task\(self\), returning the task"):
        bare.Task()


# ---- a user's own `params` package -----------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_FAMILY = """
from lingpipe import model_registry
from lingpipe.params import lm


@model_registry.RegisterSingleTaskModel
class MyLm(lm.TransformerLmTiny):
    def Task(self):
        return super().Task().Set(model_dims=32)
"""


def _UserParams(root, **modules):
    """A `params` package under `root` holding `modules` ({name: source})."""
    package = root / "params"
    package.mkdir()
    (package / "__init__.py").write_text('"""A user\'s own model params."""\n')
    for name, source in modules.items():
        (package / f"{name}.py").write_text(source)
    return package


@pytest.fixture
def shadowed_params(tmp_path):
    """Makes `params` a user's package, as `python -m` in a directory holding one does.

    The autouse fixture puts the real package and its modules back afterwards.
    """
    for name in _ParamsModules():
        if name == "params" or name.startswith("params."):
            del sys.modules[name]

    def Shadow(**modules):
        package = types.ModuleType("params")
        package.__path__ = [str(_UserParams(tmp_path, **modules))]
        sys.modules["params"] = package
        return package

    return Shadow


def test_a_users_params_package_adds_to_the_built_in_families(shadowed_params):
    package = shadowed_params(userfam=USER_FAMILY)
    keys = model_registry.ListKeys()
    assert {"lm.TransformerLmTiny", "userfam.MyLm", "mt.TransformerEncDecTiny"} <= set(keys)
    assert model_registry.GetParams("userfam.MyLm", "Train").model_dims == 32
    assert model_registry.GetClass("lm.TransformerLmTiny").__module__ == "lingpipe.params.lm"
    assert len(package.__path__) == 1  # Ours are not added to theirs.


def test_a_user_family_named_like_a_built_in_one_is_an_error(shadowed_params):
    package = shadowed_params(lm="")
    with pytest.raises(ValueError) as e:
        model_registry.GetClass("lm.TransformerLmTiny")
    assert str(e.value) == (
        "Model family 'lm' is defined twice: "
        f"{os.path.join(REPO, 'lingpipe', 'params', 'lm.py')} and "
        f"{os.path.join(package.__path__[-1], 'lm.py')}; only the first is read, so rename "
        "the other module (a family's keys are '<module>.<ClassName>')"
    )


def test_the_trainer_finds_built_in_and_user_models_beside_a_users_params(tmp_path):
    """The trainer, run in a directory holding a user's `params`, as from a regular install.

    `python -c` puts the working directory first on sys.path, as `python -m` does; the
    script drops the editable install's finder and puts a copy of the installed layout
    (`lingpipe/`, which holds lingpipe.params) behind it, beside the user's `params`.
    """
    _UserParams(tmp_path, mine=USER_FAMILY)
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(os.path.join(REPO, "lingpipe"), site / "lingpipe")
    script = (
        "import sys; site = sys.argv.pop(1); "
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in str(f)]; "
        "sys.path.insert(1, site); "
        "from lingpipe import model_registry; "
        "print(model_registry.GetClass('lm.TransformerLmTiny').__module__); "
        "from lingpipe import trainer; trainer.Run()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(site), "--model=mine.MyLm", "--mode=inspect_params"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "lingpipe.params.lm"
    assert "cls : lingpipe.models.lm.TransformerLm" in lines
    assert "model_dims : 32" in lines


def test_an_unsearched_params_in_the_working_directory_is_named(tmp_path, monkeypatch):
    """The installed command's sys.path lacks the working directory, unlike python -m."""
    local = os.path.realpath(_UserParams(tmp_path, mine=USER_FAMILY))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        model_registry.GetClass("mine.MyLm")
    assert str(e.value).endswith(
        f"Known families: {model_registry._FamilyModules()}. {local} is not searched: run "
        f"python -m lingpipe.trainer from {os.path.dirname(local)}, or put that directory "
        "on PYTHONPATH"
    )

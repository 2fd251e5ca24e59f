"""model_registry: keys, on-demand import of families, datasets, and every error."""

import os
import sys

import pytest

import params
from lingpipe import model_registry
from lingpipe.models import base_model_params

FAMILY_DIR = os.path.join(os.path.dirname(__file__), "registry_params")
TINY_KEYS = [
    "testfam.NoInputTaskModel",
    "testfam.NoSplitModel",
    "testfam.TinyModel",
    "testfam.TinyModelWithDevOther",
]


def _ForgetTestModules():
    for name in ("testfam", "brokenfam"):
        sys.modules.pop(f"params.{name}", None)
        params.__dict__.pop(name, None)


@pytest.fixture(autouse=True)
def _registry(monkeypatch):
    """An empty registry, and tests/registry_params/ as part of the `params` package."""
    monkeypatch.setattr(model_registry, "_MODELS", {})
    monkeypatch.setattr(params, "__path__", [*params.__path__, FAMILY_DIR])
    _ForgetTestModules()
    yield
    _ForgetTestModules()


def _ClassIn(module: str, name: str) -> type:
    return type(name, (base_model_params.SingleTaskModelParams,), {"__module__": module})


def test_get_params_imports_the_family_and_sets_the_train_input():
    assert "params.testfam" not in sys.modules
    p = model_registry.GetParams("testfam.TinyModel", "Train")
    assert "params.testfam" in sys.modules
    testfam = sys.modules["params.testfam"]
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
    assert cls is sys.modules["params.testfam"].TinyModel
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
        "params.nofam. Known families: ["
    )
    assert "'testfam'" in message


def test_unknown_family_suggests_close_families():
    with pytest.raises(ValueError) as e:
        model_registry.ListKeys("testfan")
    assert str(e.value).startswith(
        "Unknown model family 'testfan': there is no module params.testfan. "
        "Did you mean: ['testfam']? Known families: ["
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
    cls = model_registry.RegisterSingleTaskModel(_ClassIn("params.mt.wmt", "Big"))
    assert model_registry.GetClass("mt.wmt.Big") is cls


def test_only_classes_under_params_register():
    with pytest.raises(ValueError) as e:
        model_registry.RegisterSingleTaskModel(_ClassIn("my_models", "Outside"))
    assert str(e.value) == (
        "RegisterSingleTaskModel: Outside is defined in module 'my_models'; registered "
        "model params must live in a module of the top-level 'params' package "
        "(e.g. params/lm.py, key 'lm.Outside')"
    )


def test_only_single_task_model_params_register():
    with pytest.raises(TypeError, match=r"expects a subclass of .*SingleTaskModelParams, rec"):
        model_registry.RegisterSingleTaskModel(type("Plain", (), {"__module__": "params.x"}))


def test_train_and_task_must_be_defined():
    bare = _ClassIn("params.otherfam", "Bare")()
    with pytest.raises(TypeError, match=r"^Bare must define Train\(self\), returning the input"):
        bare.Train()
    with pytest.raises(TypeError, match=r"^Bare must define Task\(self\), returning the task"):
        bare.Task()

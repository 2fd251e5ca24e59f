"""Tests for lingpipe.hyperparams: Params, InstantiableParams and REQUIRED."""

import copy
import math
import pickle
import re
import subprocess  # noqa: F401  Imported, so that text may name subprocess.Popen.

import pytest
import tensorflow as tf

from lingpipe.hyperparams import REQUIRED, InstantiableParams, Params


class MyLayer:
    """A stand-in layer class: records what Instantiate passed it."""

    def __init__(self, params, **kwargs):
        self.params = params
        self.kwargs = kwargs


class OtherLayer(MyLayer):
    pass


def _Layer(dim=1):
    p = Params()
    p.Define("dim", dim, "Layer width.")
    return p


def _Tree():
    """A Params with every kind of value the text format supports."""
    p = Params()
    p.Define("name", "train", "Name used in messages.")
    p.Define("learning_rate", 0.1, "Learning rate.")
    p.Define("num_steps", 100, "Number of steps.")
    p.Define("use_bias", True, "Whether to add a bias.")
    p.Define("note", 'it\'s "quoted"\nand multi-line\t#not a comment', "Free text.")
    p.Define("shape", (2, 3), "A tuple.")
    p.Define("ids", [1, 2], "A list.")
    p.Define("table", {"a": 1}, "A dict.")
    p.Define("nothing", None, "Always None.")
    p.Define("dtype", tf.float32, "Activation dtype.")
    p.Define("layer_cls", MyLayer, "A class.")
    p.Define("scale", math.inf, "A non-finite float.")
    atten = Params()
    atten.Define("num_heads", 4, "Heads.")
    atten.Define("dim", REQUIRED, "Width.")
    inner = Params()
    inner.Define("dropout", 0.0, "Dropout rate.")
    atten.Define("inner", inner, "Nested twice.")
    p.Define("atten", atten, "Attention params.")
    p.Define("layers", [_Layer(1), _Layer(2)], "A list of Params.")
    return p


# ---- Define -------------------------------------------------------------------------


def test_define_and_attribute_access():
    p = Params()
    p.Define("dim", 4, "Width.")
    assert p.dim == 4
    p.dim = 8
    assert p.dim == 8
    assert len(p) == 1


@pytest.mark.parametrize("name", ["Dim", "1dim", "_dim", "dim-x", "", "class", "dIm"])
def test_define_rejects_bad_names(name):
    with pytest.raises(ValueError, match="Invalid param name"):
        Params().Define(name, 1, "Doc.")


@pytest.mark.parametrize("description", ["", "   ", None, 3])
def test_define_requires_description(description):
    with pytest.raises(ValueError, match=r"Param 'dim' needs a description \(a non-empty str\)"):
        Params().Define("dim", 1, description)


def test_define_twice_names_the_key():
    p = Params()
    p.Define("dim", 1, "Width.")
    with pytest.raises(AttributeError, match="Param 'dim' is already defined in Params '<root>'"):
        p.Define("dim", 2, "Width again.")


# ---- unknown keys -------------------------------------------------------------------


def test_unknown_key_get_says_did_you_mean():
    p = Params()
    p.Define("name", "train", "Name.")
    p.Define("learning_rate", 0.1, "Learning rate.")
    expected = "Unknown param 'lerning_rate' in Params 'train'. Did you mean: ['learning_rate']?"
    with pytest.raises(AttributeError) as info:
        _ = p.lerning_rate
    assert str(info.value) == expected


def test_unknown_key_set_says_did_you_mean():
    p = Params()
    p.Define("name", "train", "Name.")
    p.Define("learning_rate", 0.1, "Learning rate.")
    expected = "Unknown param 'lerning_rate' in Params 'train'. Did you mean: ['learning_rate']?"
    with pytest.raises(AttributeError) as info:
        p.lerning_rate = 0.2
    assert str(info.value) == expected
    with pytest.raises(AttributeError) as info:
        p.Set(lerning_rate=0.2)
    assert str(info.value) == expected
    assert p.learning_rate == 0.1


def test_unknown_key_without_close_match_lists_known_keys():
    p = Params()
    p.Define("dim", 1, "Width.")
    p.Define("bias", True, "Bias.")
    with pytest.raises(AttributeError) as info:
        _ = p.zzzzzz
    assert (
        str(info.value)
        == "Unknown param 'zzzzzz' in Params '<root>'. Known params: ['bias', 'dim']"
    )


def test_unknown_key_names_nested_path_or_name_param():
    p = _Tree()
    p.Delete("name")
    with pytest.raises(AttributeError, match=r"^Unknown param 'dimm' in Params 'atten'\."):
        _ = p.atten.dimm
    with pytest.raises(
        AttributeError, match=r"in Params 'atten\.inner'\. Did you mean: \['dropout'\]"
    ):
        p.Set(**{"atten.inner.dropot": 0.5})
    with pytest.raises(AttributeError, match=r"in Params 'layers\[1\]'\. Did you mean: \['dim'\]"):
        p.layers[1].dims = 3
    p.atten.Define("name", "self_atten", "Name.")
    with pytest.raises(AttributeError, match="in Params 'self_atten'"):
        _ = p.atten.dimm


def test_nested_path_follows_reattachment():
    p, q = _Tree(), Params()
    q.Define("enc", p.atten.inner, "Reused.")
    with pytest.raises(AttributeError, match="in Params 'enc'"):
        _ = p.atten.inner.nope
    assert getattr(p, "missing", "default") == "default"
    assert not hasattr(p, "missing")


# ---- Set / Get / Delete -------------------------------------------------------------


def test_set_is_chainable_and_reaches_into_nested_params_and_lists():
    p = _Tree()
    assert p.Set(num_steps=5, **{"atten.dim": 8, "layers[1].dim": 7}) is p
    assert (p.num_steps, p.atten.dim, p.layers[1].dim, p.layers[0].dim) == (5, 8, 7, 1)
    assert p.Get("atten.inner.dropout") == 0.0
    assert p.Get("layers[1].dim") == 7
    assert p.Get("layers[0]") is p.layers[0]
    replacement = _Layer(9)
    p.Set(**{"layers[0]": replacement})
    assert p.layers[0] is replacement


def test_set_checks_every_name_before_changing_anything():
    p = _Tree()
    with pytest.raises(AttributeError, match="Unknown param 'nope'"):
        p.Set(num_steps=5, nope=1)
    assert p.num_steps == 100


def test_set_item_of_tuple_is_refused():
    p = Params()
    p.Define("layers", (_Layer(1), _Layer(2)), "A tuple of Params.")
    assert p.Get("layers[1].dim") == 2
    with pytest.raises(TypeError, match=r"Cannot set 'layers\[0\]': it is an item of a tuple"):
        p.Set(**{"layers[0]": _Layer(3)})


def test_get_errors_say_where_the_walk_stopped():
    p = _Tree()
    with pytest.raises(AttributeError) as info:
        p.Get("num_steps.x")
    assert str(info.value) == (
        "Cannot resolve 'num_steps.x': 'num_steps' holds a int, not a Params, "
        "so it has no param 'x'."
    )
    with pytest.raises(AttributeError, match=r"'layers' has 2 items; index 5 is out of range"):
        p.Get("layers[5].dim")
    with pytest.raises(AttributeError, match=r"'atten' holds a Params, not a list"):
        p.Get("atten[0].dim")
    with pytest.raises(ValueError, match="Malformed param name 'atten..dim'"):
        p.Get("atten..dim")


def test_delete_returns_self_and_accepts_dotted_names():
    p = _Tree()
    assert p.Delete("num_steps", "atten.inner.dropout") is p
    assert "num_steps" not in p
    assert len(p.atten.inner) == 0
    with pytest.raises(AttributeError, match="Unknown param 'num_steps'"):
        p.Delete("num_steps")
    with pytest.raises(ValueError, match=r"Cannot delete 'layers\[0\]': it is a list item"):
        p.Delete("layers[0]")


def test_iter_params_contains_len():
    p = _Tree()
    names = [name for name, _ in p.IterParams()]
    assert names == sorted(names)
    assert dict(p.IterParams())["num_steps"] == 100
    assert len(p) == 14
    assert "atten" in p
    assert "atten.inner.dropout" in p
    assert "layers[1].dim" in p
    assert "layers[2].dim" not in p
    assert "atten.nope" not in p
    assert "atten..x" not in p
    assert 3 not in p


def test_cycle_is_refused():
    p = _Tree()
    with pytest.raises(ValueError, match="would make a cycle"):
        p.atten.inner.Define("loop", p, "Back to the root.")
    with pytest.raises(ValueError, match="would make a cycle"):
        p.Set(**{"atten.inner": p})


# ---- equality and copies ------------------------------------------------------------


def test_eq_is_deep():
    a, b = _Tree(), _Tree()
    assert a == b
    b.atten.inner.dropout = 0.5
    assert a != b
    b = _Tree()
    b.layers[1].dim = 3
    assert a != b
    b = _Tree()
    b.Delete("nothing")
    assert a != b
    assert a != {"num_steps": 100}


def test_copy_is_deep_but_shares_classes_dtypes_and_required():
    p = _Tree()
    q = p.Copy()
    assert q == p and q is not p
    assert q.atten is not p.atten and q.layers[0] is not p.layers[0]
    assert q.ids is not p.ids and q.table is not p.table
    assert q.layer_cls is MyLayer
    assert q.dtype is tf.float32
    assert q.atten.dim is REQUIRED
    q.atten.inner.dropout = 0.3
    q.layers[0].dim = 10
    q.ids.append(3)
    assert (p.atten.inner.dropout, p.layers[0].dim, p.ids) == (0.0, 1, [1, 2])
    assert copy.deepcopy(p) == p
    assert copy.copy(p).atten is not p.atten


def test_copy_keeps_subclass_and_nested_paths():
    p = InstantiableParams(MyLayer)
    p.Define("atten", _Layer(), "Nested.")
    q = p.Copy()
    assert type(q) is InstantiableParams and q.cls is MyLayer
    with pytest.raises(AttributeError, match="in Params 'atten'"):
        _ = q.atten.nope
    # A copy of a nested Params is a root of its own.
    with pytest.raises(AttributeError, match="in Params '<root>'"):
        _ = p.atten.Copy().nope


def test_pickle_round_trip():
    p = _Tree()
    q = pickle.loads(pickle.dumps(p))
    assert q == p
    assert q.atten.dim is REQUIRED


# ---- Freeze -------------------------------------------------------------------------


def test_freeze_refuses_every_change():
    p = Params()
    p.Define("name", "foo", "Name.")
    p.Define("x", 1, "X.")
    assert p.Freeze() is p
    assert p.IsFrozen()
    expected = "Params 'foo' is frozen; make a Copy() to change it (tried to set 'x')"
    with pytest.raises(TypeError) as info:
        p.x = 2
    assert str(info.value) == expected
    with pytest.raises(TypeError) as info:
        p.Set(x=2)
    assert str(info.value) == expected
    with pytest.raises(TypeError, match=re.escape("(tried to define 'y')")):
        p.Define("y", 1, "Y.")
    with pytest.raises(TypeError, match=re.escape("(tried to delete 'x')")):
        p.Delete("x")
    with pytest.raises(TypeError, match=re.escape("(tried to set params from text)")):
        p.FromText("x : 2")
    assert p.x == 1


def test_freeze_is_recursive_and_copy_unfreezes():
    p = _Tree().Freeze()
    for nested in (p.atten, p.atten.inner, p.layers[1]):
        assert nested.IsFrozen()
    with pytest.raises(TypeError, match=r"^Params 'atten\.inner' is frozen"):
        p.atten.inner.dropout = 0.5
    with pytest.raises(TypeError, match=r"^Params 'train' is frozen.*'atten\.inner\.dropout'"):
        p.Set(**{"atten.inner.dropout": 0.5})
    with pytest.raises(TypeError, match=r"^Params 'layers\[1\]' is frozen"):
        p.layers[1].dim = 5
    q = p.Copy()
    assert not q.IsFrozen()
    assert not q.atten.inner.IsFrozen() and not q.layers[1].IsFrozen()
    q.atten.inner.dropout = 0.5
    q.layers[1].dim = 5
    assert p.atten.inner.dropout == 0.0 and p.layers[1].dim == 2


# ---- printing -----------------------------------------------------------------------


def test_str_is_nested_and_indented():
    p = Params()
    p.Define("dim", 4, "Width.")
    p.Define("note", "a'b", "Text.")
    atten = Params()
    atten.Define("heads", REQUIRED, "Heads.")
    p.Define("atten", atten, "Nested.")
    p.Define("layers", [_Layer(1)], "List.")
    p.Define("dtype", tf.bfloat16, "Dtype.")
    expected = "\n".join(
        [
            "{",
            "  atten: {",
            "    heads: REQUIRED",
            "  }",
            "  dim: 4",
            "  dtype: tf.bfloat16",
            "  layers[0]: {",
            "    dim: 1",
            "  }",
            '  note: "a\'b"',
            "}",
        ]
    )
    assert str(p) == expected
    assert repr(p) == expected


def test_required_marker():
    assert repr(REQUIRED) == "REQUIRED"
    assert type(REQUIRED)() is REQUIRED  # One instance, wherever it is made.
    assert copy.deepcopy(REQUIRED) is REQUIRED
    assert pickle.loads(pickle.dumps(REQUIRED)) is REQUIRED


# ---- ToText / FromText --------------------------------------------------------------


def test_to_text_format():
    p = _Tree()
    cls_path = f"{MyLayer.__module__}.MyLayer"
    expected = "".join(
        line + "\n"
        for line in [
            "atten.dim : REQUIRED",
            "atten.inner.dropout : 0.0",
            "atten.num_heads : 4",
            "dtype : tf.float32",
            "ids : [1, 2]",
            f"layer_cls : {cls_path}",
            "layers[0].dim : 1",
            "layers[1].dim : 2",
            "learning_rate : 0.1",
            "name : 'train'",
            "note : 'it\\'s \"quoted\"\\nand multi-line\\t#not a comment'",
            "nothing : None",
            "num_steps : 100",
            "scale : inf",
            "shape : (2, 3)",
            "table : {'a': 1}",
            "use_bias : True",
        ]
    )
    assert p.ToText() == expected


def test_to_text_include_types_adds_comments():
    p = _Tree()
    lines = p.ToText(include_types=True).splitlines()
    assert "atten.dim : REQUIRED  # REQUIRED" in lines
    assert "dtype : tf.float32  # tf.DType" in lines
    assert "num_steps : 100  # int" in lines
    assert "nothing : None  # NoneType" in lines
    assert "shape : (2, 3)  # tuple" in lines
    assert f"layer_cls : {MyLayer.__module__}.MyLayer  # class" in lines


@pytest.mark.parametrize("include_types", [False, True])
def test_from_text_round_trip(include_types):
    p = _Tree()
    p.Set(learning_rate=2.5e-4, use_bias=False, nothing=None, ids=[], shape=(7,))
    p.Set(dtype=tf.bfloat16, layer_cls=OtherLayer, scale=-math.inf, note="x\n'y'\"z\\")
    p.Set(**{"atten.dim": 16, "atten.inner.dropout": 0.25, "layers[1].dim": 64})
    text = p.ToText(include_types=include_types)
    q = _Tree()
    assert q != p
    assert q.FromText(text) is q
    assert q == p
    assert q.ToText() == p.ToText()
    assert q.dtype is tf.bfloat16 and q.layer_cls is OtherLayer
    assert type(q.shape) is tuple and q.shape == (7,)
    assert q.note == "x\n'y'\"z\\"
    assert q.TextDiff(p) == ""


def test_from_text_nan_and_required_back():
    p = _Tree()
    p.scale = math.nan
    p.atten.dim = 4
    q = _Tree().FromText(p.ToText())
    assert math.isnan(q.scale)
    assert q.atten.dim == 4
    q.FromText("atten.dim : REQUIRED")
    assert q.atten.dim is REQUIRED


def test_from_text_ignores_blank_lines_and_comments():
    p = _Tree()
    text = """
    # A comment line.

       num_steps : 7   # trailing comment
    note : 'has # inside'
    """
    p.FromText(text)
    assert (p.num_steps, p.note) == (7, "has # inside")


@pytest.mark.parametrize(
    "attack",
    [
        "__import__('os').system('ls')",
        "print(1)",
        "open('/etc/passwd').read()",
        "().__class__.__bases__[0].__subclasses__()",
        "lambda: 0",
        "[x for x in (1, 2)]",
        "1; import os",
        "os.system",
        "builtins.eval",
        "os.__loader__",
        "tf.compat.v1.enable_eager_execution()",
        "tf.float32.__class__",
        "'a' + 'b'",
        "not_a_module.SomeClass",
    ],
)
def test_from_text_refuses_code(attack, capsys):
    p = Params()
    p.Define("a", None, "Anything.")
    with pytest.raises(ValueError) as info:
        p.FromText(f"# header\na : {attack}")
    assert str(info.value).startswith("FromText line 2: value for 'a' is not a literal")
    assert p.a is None
    assert capsys.readouterr().out == ""


def test_from_text_refuses_code_even_for_unknown_key():
    with pytest.raises(ValueError, match="line 1: value for 'x' is not a literal"):
        Params().FromText("x : print(1)")


def test_from_text_unknown_key_says_did_you_mean():
    p = _Tree()
    expected = "Unknown param 'lerning_rate' in Params 'train'. Did you mean: ['learning_rate']?"
    with pytest.raises(AttributeError) as info:
        p.FromText("lerning_rate : 0.5")
    assert str(info.value) == expected


def test_from_text_checks_types():
    p = _Tree()
    with pytest.raises(ValueError) as info:
        p.FromText("num_steps : 'ten'")
    assert str(info.value) == (
        "FromText line 1: param 'num_steps' expects int; received 'ten' (str)."
    )
    bad = {
        "use_bias : 1": "expects bool",
        "num_steps : True": "expects int",
        "learning_rate : 'x'": r"expects float \(or int\)",
        "name : 3": "expects str",
        "shape : 3": "expects list or tuple",
        "dtype : 'float32'": r"expects tf\.DType",
        "layer_cls : 'MyLayer'": "expects class",
        "atten : 3": "expects a nested Params",
        "table : [1]": "expects dict",
    }
    for line, message in bad.items():
        with pytest.raises(ValueError, match=message):
            p.FromText(line)
    assert p == _Tree()


def test_from_text_accepts_compatible_values():
    p = _Tree()
    p.FromText("learning_rate : 1\nshape : [4, 5]\nids : (3,)\nnum_steps : None\natten : None")
    assert p.learning_rate == 1.0 and type(p.learning_rate) is float
    assert p.shape == (4, 5) and p.ids == [3]
    assert p.num_steps is None and p.atten is None
    p.FromText("num_steps : 3\nnothing : 'anything'")
    assert p.num_steps == 3 and p.nothing == "anything"


def test_text_types_let_a_param_take_other_types_from_text():
    p = Params()
    p.Define("remat", "always", "A policy, or one per stage.", text_types=(str, list, tuple))
    p.FromText("remat : ['always', 'never']")
    assert p.remat == ["always", "never"]
    q = p.Copy()
    q.remat = "never"
    assert q.FromText(p.ToText()) == p  # the list reads back where a str was
    assert p.FromText("remat : 'never'").remat == "never"  # and a str where a list was
    with pytest.raises(ValueError) as info:
        p.FromText("remat : 3")
    assert str(info.value) == (
        "FromText line 1: param 'remat' expects str, list or tuple; received 3 (int)."
    )


def test_from_text_changes_nothing_when_a_line_fails():
    p = _Tree()
    with pytest.raises(ValueError, match="line 2"):
        p.FromText("num_steps : 1\nname : 2")
    assert p.num_steps == 100


def test_from_text_malformed_lines_and_unknown_dtype():
    p = _Tree()
    with pytest.raises(
        ValueError, match="FromText line 1: expected 'name : value'; got 'num_steps 5'"
    ):
        p.FromText("num_steps 5")
    with pytest.raises(ValueError, match="FromText line 1: expected 'name : value'"):
        p.FromText("Num_Steps : 5")
    with pytest.raises(ValueError, match="line 1: value for 'num_steps' is not a literal"):
        p.FromText("num_steps :")
    with pytest.raises(ValueError, match="'tf.notadtype' is not a TensorFlow dtype"):
        p.FromText("dtype : tf.notadtype")


def test_values_without_text_form_are_described_and_read_back_unchanged():
    def Local():
        pass

    p = Params()
    p.Define("fn", Local, "A function.")
    p.Define("obj", object(), "An object.")
    p.Define("dim", 1, "Width.")
    text = p.ToText()
    fn_text = f"<function {__name__}.{Local.__qualname__}>"
    assert "<locals>" in fn_text
    assert text == f"dim : 1\nfn : {fn_text}\nobj : <builtins.object object>\n"
    q = p.Copy()
    q.dim = 2
    q.FromText(text)
    assert q.dim == 1 and q.fn is Local
    with pytest.raises(ValueError, match="value for 'fn' is not a literal"):
        q.FromText("fn : <function os.system>")


def test_containers_without_text_form_are_described_element_by_element():
    p = Params()
    p.Define("dtypes", (tf.float32, tf.int32), "Dtypes.")
    p.Define("single", (MyLayer,), "One class.")
    p.Define("mixed", {"a": [math.nan, REQUIRED, b"x"]}, "Non-finite inside.")
    assert p.ToText() == (
        "dtypes : <(tf.float32, tf.int32)>\n"
        "mixed : <{'a': [nan, REQUIRED, b'x']}>\n"
        f"single : <({MyLayer.__module__}.MyLayer,)>\n"
    )
    assert "  dtypes: <(tf.float32, tf.int32)>" in str(p).splitlines()
    q = p.Copy().FromText(p.ToText())
    assert q.dtypes == (tf.float32, tf.int32) and q.single == (MyLayer,)
    with pytest.raises(ValueError, match="value for 'dtypes' is not a literal"):
        q.FromText("dtypes : <(tf.float32,)>")


# ---- TextDiff -----------------------------------------------------------------------


def test_text_diff():
    p, q = _Tree(), _Tree()
    assert p.TextDiff(q) == ""
    q.Set(num_steps=5, **{"atten.dim": 8, "layers[1].dim": 3})
    q.Delete("nothing")
    q.Define("extra", "e", "Only in q.")
    expected = (
        "> atten.dim : REQUIRED\n"
        "< atten.dim : 8\n"
        "< extra : 'e'\n"
        "> layers[1].dim : 2\n"
        "< layers[1].dim : 3\n"
        "> nothing : None\n"
        "> num_steps : 100\n"
        "< num_steps : 5\n"
    )
    assert p.TextDiff(q) == expected


# ---- InstantiableParams -------------------------------------------------------------


def test_instantiate_builds_cls_with_params_and_kwargs():
    p = InstantiableParams(MyLayer)
    p.Define("dim", 4, "Width.")
    layer = p.Instantiate(extra=1)
    assert isinstance(layer, MyLayer)
    assert layer.params is p and layer.kwargs == {"extra": 1}


def test_instantiate_without_cls():
    p = InstantiableParams()
    assert p.cls is None
    with pytest.raises(ValueError, match="Cannot Instantiate Params '<root>': 'cls' is None"):
        p.Instantiate()


def test_instantiate_names_required_dotted_path():
    p = InstantiableParams(MyLayer)
    p.Define("a", Params(), "Nested.")
    p.a.Define("b", REQUIRED, "Must be set.")
    with pytest.raises(ValueError) as info:
        p.Instantiate()
    assert str(info.value).startswith("Params for MyLayer: required param 'a.b' was not set.")
    p.Define("layers", [_Layer(1), _Layer(REQUIRED)], "List.")
    p.Define("dims", [3, REQUIRED], "Plain list.")
    with pytest.raises(ValueError) as info:
        p.Instantiate()
    assert str(info.value).startswith(
        "Params for MyLayer: required params 'a.b', 'dims[1]', 'layers[1].dim' were not set."
    )
    p.Set(**{"a.b": 1, "dims": [3, 4], "layers[1].dim": 2})
    assert isinstance(p.Instantiate(), MyLayer)


# ---- class-valued params ------------------------------------------------------------


def _TrainParams():
    """A `train` Params holding a schedule's params, as a task's params do."""
    from lingpipe import lr_schedules, optimizers  # noqa: F401  Imported, so text may name them.

    p = Params()
    p.Define("train", Params(), "Training settings.")
    p.train.Define("lr_schedule", lr_schedules.Cosine.Params(), "Schedule params.")
    return p


def test_from_text_refuses_a_class_outside_the_fields_base():
    p = _TrainParams()
    with pytest.raises(ValueError) as info:
        p.FromText("train.lr_schedule.cls : subprocess.Popen")
    assert str(info.value) == (
        "FromText line 1: train.lr_schedule.cls: expected a subclass of "
        "lingpipe.lr_schedules.BaseSchedule, received subprocess.Popen"
    )
    with pytest.raises(
        ValueError, match="expected a subclass of lingpipe.lr_schedules.BaseSchedule"
    ):
        p.FromText("train.lr_schedule.cls : lingpipe.optimizers.Adam")
    assert p == _TrainParams()
    p.FromText("train.lr_schedule.cls : lingpipe.lr_schedules.Constant")
    assert p.train.lr_schedule.cls.__name__ == "Constant"


def test_the_expected_base_is_the_nearest_lingpipe_base_of_the_default():
    from lingpipe.inputs import text_lm
    from lingpipe.layers import linear
    from lingpipe.models import lm

    for params, base in [
        (lm.TransformerLm.Params(), "lingpipe.models.base_task.BaseTask"),
        (linear.LinearLayer.Params(), "lingpipe.base_layer.BaseLayer"),
        (text_lm.TextLmInput.Params(), "lingpipe.inputs.base_input.BaseInputGenerator"),
    ]:
        with pytest.raises(ValueError, match=f"expected a subclass of {base}, received"):
            params.Copy().FromText("cls : subprocess.Popen")
    # A layer is no task, though both are BaseLayers.
    with pytest.raises(ValueError, match="expected a subclass of lingpipe.models.base_task"):
        lm.TransformerLm.Params().FromText("cls : lingpipe.layers.linear.LinearLayer")


def test_a_class_without_a_lingpipe_base_accepts_its_own_subclasses():
    p = _Tree()
    with pytest.raises(ValueError) as info:
        p.FromText("layer_cls : subprocess.Popen")
    assert str(info.value) == (
        f"FromText line 1: layer_cls: expected a subclass of {__name__}.MyLayer, "
        "received subprocess.Popen"
    )
    p.FromText(f"layer_cls : {__name__}.OtherLayer")
    assert p.layer_cls is OtherLayer
    # The base comes from the default, so it does not narrow once a subclass is set.
    p.FromText(f"layer_cls : {__name__}.MyLayer")
    assert p.Copy().FromText(f"layer_cls : {__name__}.OtherLayer").layer_cls is OtherLayer


def test_a_declared_base_and_a_field_without_a_class():
    p = Params()
    p.Define("cell_cls", None, "A layer class.", base=MyLayer)
    p.FromText(f"cell_cls : {__name__}.OtherLayer")
    assert p.cell_cls is OtherLayer
    with pytest.raises(ValueError, match=f"cell_cls: expected a subclass of {__name__}.MyLayer"):
        p.Copy().FromText("cell_cls : subprocess.Popen")
    with pytest.raises(ValueError) as info:
        Params().Define("x_cls", int, "A class.", base=MyLayer)
    assert str(info.value) == (
        f"Param 'x_cls': default builtins.int is not a subclass of its base {__name__}.MyLayer"
    )
    # No class and no declared base: only subclasses of lingpipe's bases.
    q = InstantiableParams()
    with pytest.raises(ValueError, match="cls: expected a subclass of one of lingpipe.models"):
        q.FromText("cls : subprocess.Popen")
    q.FromText("cls : lingpipe.lr_schedules.Constant")
    assert q.cls.__name__ == "Constant"

"""Tests for lingpipe.params_text: the value <-> text format used by Params."""

import math
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from lingpipe import params_text
from lingpipe.hyperparams import REQUIRED, Params


class MyLayer:
    pass


@pytest.mark.parametrize(
    "value",
    [0, -3, 1.5, True, None, "a\nb # not a comment", b"\x00", 2j, [1, (2, 3)], {"k": {4}}],
)
def test_literals_round_trip(value):
    text = params_text.ValueText(value)
    assert text == repr(value)
    assert params_text.ParseValue(text) == value


def test_special_forms_round_trip():
    for value in (REQUIRED, tf.float32, tf.int64, tf.bfloat16, MyLayer, math.inf, -math.inf):
        assert params_text.ParseValue(params_text.ValueText(value)) == value
    assert params_text.ValueText(tf.float32) == "tf.float32"
    assert params_text.ParseValue("tf.bfloat16") is tf.bfloat16
    assert params_text.ValueText(REQUIRED) == "REQUIRED"
    assert params_text.ParseValue("REQUIRED") is REQUIRED
    assert params_text.ValueText(MyLayer) == f"{__name__}.MyLayer"
    assert math.isnan(params_text.ParseValue(params_text.ValueText(math.nan)))


@pytest.mark.parametrize(
    "text, message",
    [
        ("__import__('os')", "\"__import__('os')\""),
        ("open('/etc/passwd').read()", "\"open('/etc/passwd').read()\""),
        ("os.system", "'os.system' does not name a class in an imported module"),
        ("math.__class__", "'math.__class__' does not name a class"),
        ("builtins.__import__", "'builtins.__import__' does not name a class"),
        ("tf.not_a_dtype", "'tf.not_a_dtype' is not a TensorFlow dtype"),
        ("<function f>", "'<function f>'"),
    ],
)
def test_parse_value_refuses_code(text, message):
    with pytest.raises(params_text.NotLiteralError, match="^" + re.escape(message)):
        params_text.ParseValue(text)


def test_not_literal_error_is_value_error():
    assert issubclass(params_text.NotLiteralError, ValueError)


def test_text_of_describes_values_without_a_text_form():
    def Fn():
        pass

    assert params_text.ValueText(Fn) is None
    assert params_text.TextOf(Fn) == f"<function {__name__}.{Fn.__qualname__}>"
    assert params_text.TextOf([1, REQUIRED, len]) == "<[1, REQUIRED, function builtins.len]>"
    assert params_text.TextOf((len,)) == "<(function builtins.len,)>"
    assert params_text.OpaqueText(object()) == "<builtins.object object>"


def test_type_name():
    assert params_text.TypeName(REQUIRED) == "REQUIRED"
    assert params_text.TypeName(tf.float32) == "tf.DType"
    assert params_text.TypeName(MyLayer) == "class"
    assert params_text.TypeName(4) == "int"
    assert params_text.IsDType(tf.float32)
    assert not params_text.IsDType("float32")


def test_split_line():
    assert params_text.SplitLine("a.b[1].c : 'x # y'  # note") == ("a.b[1].c", "'x # y'")
    assert params_text.SplitLine("dim:4") == ("dim", "4")
    assert params_text.SplitLine("Dim : 4") is None
    assert params_text.SplitLine("dim = 4") is None


def test_coerce():
    assert params_text.Coerce(1.0, 2) == (True, 2.0)
    assert params_text.Coerce((1, 2), [3]) == (True, (3,))
    assert params_text.Coerce(1, True) == (False, True)
    assert params_text.Coerce("s", REQUIRED) == (True, REQUIRED)
    assert params_text.Coerce(tf.float32, "float32") == (False, "float32")
    assert params_text.ExpectedTypeName(1.0) == "float (or int)"


def test_a_nested_params_takes_only_none_from_text():
    # The format knows no Params (params_text imports nothing of lingpipe's): FromText
    # checks a nested Params itself.
    p = Params()
    p.Define("child", Params(), "A nested Params.")
    with pytest.raises(ValueError, match=r"param 'child' expects a nested Params \(set its"):
        p.FromText("child : 3")
    assert p.FromText("child : None").child is None


def test_either_module_can_be_imported_first():
    # params_text is below hyperparams (it imports nothing of lingpipe's); either order works.
    for first in ("lingpipe.params_text", "lingpipe.hyperparams"):
        code = f"import {first}; from lingpipe import hyperparams; hyperparams.Params().ToText()"
        subprocess.run([sys.executable, "-c", code], check=True)


def test_lingpipe_base_class_paths_name_classes():
    import importlib

    for path in params_text.BASE_CLASS_PATHS:
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert isinstance(cls, type) and f"{cls.__module__}.{cls.__qualname__}" == path


def test_expected_base():
    from lingpipe import base_layer, lr_schedules, optimizers
    from lingpipe.models import base_task, lm

    class Root:
        @classmethod
        def Params(cls):
            return None

    class Child(Root):
        @classmethod
        def Params(cls):
            return None

    class Leaf(Child):
        pass

    assert params_text.ExpectedBase(lm.TransformerLm) is base_task.BaseTask
    assert params_text.ExpectedBase(lm.LmEmbeddingCell) is base_layer.BaseLayer
    assert params_text.ExpectedBase(optimizers.Adam) is optimizers.BaseOptimizer
    assert params_text.ExpectedBase(lr_schedules.BaseSchedule) is lr_schedules.BaseSchedule
    assert params_text.ExpectedBase(Leaf) is Root  # The class whose Params() others override.
    assert params_text.ExpectedBase(MyLayer) is MyLayer
    assert params_text.ClassError("a.cls", Leaf, Root) is None
    assert params_text.ClassError("a.cls", subprocess.Popen, Root) == (
        f"a.cls: expected a subclass of {__name__}.{Root.__qualname__}, received subprocess.Popen"
    )

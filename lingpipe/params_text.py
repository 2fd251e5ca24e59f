"""The value <-> text format behind `Params.ToText`, `FromText` and `TextDiff`.

One line of text is `name : value`, optionally followed by a `# comment`. A value
is written as:

  * a Python literal, via `repr` (ints, floats, bools, None, strings, bytes, and
    lists/tuples/dicts/sets of those).
  * `inf`, `-inf`, `nan` for non-finite floats.
  * `tf.<name>` for a `tf.DType`, e.g. `tf.float32`.
  * the bare dotted path `module.Class` for a class.
  * the bare word `REQUIRED` for `REQUIRED`, the marker of a param that must be set.
  * `<...>` for anything else: a description that cannot be read back.

Reading never evaluates text and never imports what text names: literals go through
`ast.literal_eval`, the other forms are matched by pattern, and a class path is
looked up without running code (`inspect.getattr_static`) in modules that are
already imported. TensorFlow is imported, lazily, only to read `tf.<name>`.

A class read from text must also fit its param: it must be a subclass of the
param's expected base (`ExpectedBase`, `ClassError`), so that text can name another
schedule for a schedule's `cls` but not `subprocess.Popen`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import math
import re
import sys
import tokenize
from typing import Any

__all__ = [
    "BASE_CLASS_PATHS",
    "ClassError",
    "ClassName",
    "Coerce",
    "ExpectedBase",
    "ExpectedTypeName",
    "IsDType",
    "NotLiteralError",
    "OpaqueText",
    "ParseValue",
    "REQUIRED",
    "SplitLine",
    "TextOf",
    "TypeName",
    "ValueText",
]

_LINE_RE = re.compile(
    r"^(?P<key>[a-z][a-z0-9_]*(?:\[\d+\])*(?:\.[a-z][a-z0-9_]*(?:\[\d+\])*)*)"
    r"\s*:\s*(?P<value>.*)$"
)
_DTYPE_RE = re.compile(r"^tf\.([a-z][a-z0-9_]*)$")
_CLASS_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

# lingpipe's base classes, by path: this low module imports none of them. A class
# param whose class derives from one of them accepts that base's subclasses.
BASE_CLASS_PATHS = (
    "lingpipe.models.base_task.BaseTask",
    "lingpipe.base_layer.BaseLayer",
    "lingpipe.inputs.base_input.BaseInputGenerator",
    "lingpipe.optimizers.BaseOptimizer",
    "lingpipe.lr_schedules.BaseSchedule",
)


# Modules that moved, by their previous path, so that a params file written before the
# move still reads (for one release), e.g. a learning-rate schedule's `cls`.
_MOVED_MODULES = {"lingpipe.schedules": "lingpipe.lr_schedules"}


class NotLiteralError(ValueError):
    """`ParseValue` was given text that is none of the accepted value forms."""


class _RequiredMarker:
    """Type of `REQUIRED`; there is exactly one instance."""

    _instance: _RequiredMarker | None = None

    def __new__(cls) -> _RequiredMarker:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REQUIRED"

    def __copy__(self) -> _RequiredMarker:
        return self

    def __deepcopy__(self, memo: dict) -> _RequiredMarker:
        return self

    def __reduce__(self) -> str:
        return "REQUIRED"  # Unpickles to the module-level singleton.


# Defined here, below `hyperparams` (which exports it as hyperparams.REQUIRED), because
# it is one of the text format's values: this module imports nothing of lingpipe's.
REQUIRED = _RequiredMarker()
"""Default for a param that must be set before `InstantiableParams.Instantiate`."""


# ---- value -> text ---------------------------------------------------------------


def IsDType(value: Any) -> bool:
    """Whether `value` is a `tf.DType`, checked without importing TensorFlow."""
    cls = type(value)
    return cls.__name__ == "DType" and cls.__module__.startswith("tensorflow")


def ValueText(value: Any) -> str | None:
    """The text `ParseValue` reads back as `value`, or None if there is none."""
    if value is REQUIRED:
        return "REQUIRED"
    if IsDType(value):
        return f"tf.{value.name}"
    if isinstance(value, type):
        return _ClassPath(value)
    if type(value) is float and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if _IsPlainLiteral(value):
        return repr(value)
    return None


def OpaqueText(value: Any) -> str:
    """A stable one-line `<...>` description of a value that has no text form.

    Stable means no memory addresses, so a Copy() is described the same way.
    """
    return f"<{_Describe(value)}>"


def TextOf(value: Any) -> str:
    """The ToText form of `value`: its text form, else its `<...>` description."""
    text = ValueText(value)
    return OpaqueText(value) if text is None else text


def TypeName(value: Any) -> str:
    """The short type name that `ToText(include_types=True)` and errors show."""
    if value is REQUIRED:
        return "REQUIRED"
    if IsDType(value):
        return "tf.DType"
    if isinstance(value, type):
        return "class"
    return type(value).__name__


def _IsPlainLiteral(value: Any) -> bool:
    """Whether `repr(value)` is read back by `ast.literal_eval` as an equal value."""
    kind = type(value)
    if value is None or kind in (bool, int, str, bytes):
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is complex:
        return math.isfinite(value.real) and math.isfinite(value.imag)
    if kind in (list, tuple, set):
        return all(_IsPlainLiteral(v) for v in value)
    if kind is dict:
        return all(_IsPlainLiteral(k) and _IsPlainLiteral(v) for k, v in value.items())
    return False


def _ClassPath(cls: type) -> str | None:
    if "<" in cls.__qualname__:  # Defined inside a function: no importable path.
        return None
    return f"{cls.__module__}.{cls.__qualname__}"


def _Describe(value: Any) -> str:
    if type(value) in (list, tuple):
        items = [ValueText(v) or _Describe(v) for v in value]
        if type(value) is list:
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if type(value) is dict:
        items = [
            f"{ValueText(k) or _Describe(k)}: {ValueText(v) or _Describe(v)}"
            for k, v in value.items()
        ]
        return f"{{{', '.join(items)}}}"
    name = getattr(value, "__qualname__", None)
    module = getattr(value, "__module__", None)
    if isinstance(name, str) and isinstance(module, str):
        kind = "class" if isinstance(value, type) else "function"
        return f"{kind} {module}.{name}"
    return f"{type(value).__module__}.{type(value).__qualname__} object"


# ---- text -> value ---------------------------------------------------------------


def SplitLine(line: str) -> tuple[str, str] | None:
    """(dotted name, value text) of a `name : value  # comment` line; None if malformed.

    The comment, if any, is dropped from the value text.
    """
    match = _LINE_RE.match(line)
    if not match:
        return None
    return match.group("key"), _StripComment(match.group("value"))


def ParseValue(text: str) -> Any:
    """The value that `text` (one value of the text format) stands for.

    Raises:
      NotLiteralError: `text` is none of the forms in the module docstring, names a
        dtype TensorFlow does not know, or a class that is not in an imported module.
    """
    if text == "REQUIRED":
        return REQUIRED
    if text in _NON_FINITE:
        return _NON_FINITE[text]
    match = _DTYPE_RE.match(text)
    if match:
        tf = importlib.import_module("tensorflow")  # A fixed module, never one from text.
        try:
            return tf.as_dtype(match.group(1))
        except (TypeError, ValueError) as e:
            raise NotLiteralError(f"{text!r} is not a TensorFlow dtype") from e
    if _CLASS_PATH_RE.match(text):
        cls = _ResolveClass(text)
        for before, after in _MOVED_MODULES.items():
            if cls is None and text.startswith(before + "."):
                cls = _ResolveClass(after + text[len(before) :])
        if cls is None:
            raise NotLiteralError(f"{text!r} does not name a class in an imported module")
        return cls
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise NotLiteralError(f"{text!r}") from e


def Coerce(current: Any, new: Any) -> tuple[bool, Any]:
    """Checks `new` (read from text) against the type of `current`.

    Returns (ok, value to store). Only clear mismatches fail: None and REQUIRED fit
    anything, an int fits a float param (stored as float), a list fits a tuple
    param and vice versa (stored as the current container type). A nested Params is
    not a value of this format: `Params.FromText` checks that case itself.
    """
    if new is None or new is REQUIRED or current is None or current is REQUIRED:
        return True, new
    if isinstance(current, bool):
        return isinstance(new, bool), new
    if isinstance(current, int):
        return isinstance(new, int) and not isinstance(new, bool), new
    if isinstance(current, float):
        if isinstance(new, (int, float)) and not isinstance(new, bool):
            return True, float(new)
        return False, new
    if isinstance(current, (list, tuple)):
        if not isinstance(new, (list, tuple)):
            return False, new
        return True, type(current)(new) if type(current) in (list, tuple) else new
    for kind in ((str,), (bytes,), (dict,), (set, frozenset), (type,)):
        if isinstance(current, kind):
            return isinstance(new, kind), new
    if IsDType(current):
        return IsDType(new), new
    return True, new  # No text form to check against (functions, objects).


def ExpectedBase(cls: type) -> type:
    """The class whose subclasses a param defined with class `cls` accepts from text.

    In order: the nearest of lingpipe's base classes (`BASE_CLASS_PATHS`) in `cls`'s
    MRO, so a task's `cls` takes tasks (BaseTask, not BaseLayer), an optimizer's
    optimizers; else the most general class in the MRO that defines its own
    `Params()` (the root of the family these params come from); else `cls` itself.
    """
    mro = [c for c in cls.__mro__ if c is not object]
    for c in mro:
        if _ClassPath(c) in BASE_CLASS_PATHS:
            return c
    roots = [c for c in mro if "Params" in vars(c)]
    return roots[-1] if roots else cls


def ClassError(name: str, cls: type, base: type | None) -> str | None:
    """Why class `cls` read from text may not be param `name`'s value; None if it may.

    Args:
      name: the param's dotted name, for the message.
      cls: the class the text names.
      base: the param's expected base; None when the param has no class to infer one
        from and none was declared: then any subclass of a lingpipe base fits.
    """
    if base is not None:
        if issubclass(cls, base):
            return None
        expected = f"a subclass of {ClassName(base)}"
    else:
        if any(_ClassPath(c) in BASE_CLASS_PATHS for c in cls.__mro__):
            return None
        expected = f"a subclass of one of {', '.join(BASE_CLASS_PATHS)}"
    return f"{name}: expected {expected}, received {ClassName(cls)}"


def ClassName(cls: type) -> str:
    """`module.QualName` of `cls`, for messages (also for classes defined in functions)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def ExpectedTypeName(current: Any, text_types: tuple[type, ...] = ()) -> str:
    """What `Coerce` accepts in place of `current`, for an error message; `text_types`
    (a param's declared types: Params.Define) name them instead: 'str, list or tuple'."""
    if text_types:
        names = [t.__name__ for t in text_types]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    if isinstance(current, (list, tuple)):
        return "list or tuple"
    if isinstance(current, float):
        return "float (or int)"
    return TypeName(current)


def _StripComment(text: str) -> str:
    """Drops a trailing `# ...` comment that is not inside a string literal."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                return text[: tok.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass  # Malformed text: ast.literal_eval will reject it with a clear error.
    return text


def _ResolveClass(path: str) -> type | None:
    """The class at dotted `path` in an already-imported module, without running code."""
    parts = path.split(".")
    if any(part.startswith("__") for part in parts):
        return None
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is None:
            continue
        obj: Any = module
        try:
            for attr in parts[split:]:
                obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            return None
        return obj if isinstance(obj, type) else None
    return None

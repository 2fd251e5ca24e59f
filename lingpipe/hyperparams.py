"""Params: declarative, documented hyper-parameters, after Lingvo's `hyperparams.py`.

A `Params` holds named values, each defined once with a description:

    p = Params()
    p.Define('dim', REQUIRED, 'Model dimension.')
    p.Define('dropout', 0.1, 'Dropout rate.')
    p.dim = 512
    p.Set(**{'atten.num_heads': 8, 'layers[1].dim': 4})

Values may be nested `Params` and lists (or tuples) of `Params`; dotted names with
`[i]` indices reach into them in `Set`, `Get`, `Delete` and the text format.

Text format (`ToText`/`FromText`): one `name : value` line per leaf, sorted by name.
Nested Params are flattened with dots (`atten.num_heads`), lists of Params with
indices (`layers[1].dim`). A value is written as:

  * a Python literal, via `repr` (ints, floats, bools, None, strings, bytes, and
    lists/tuples/dicts/sets of those). Strings stay on one line: `'a\\nb'`.
  * `inf`, `-inf`, `nan` for non-finite floats.
  * `tf.<name>` for a `tf.DType`, e.g. `tf.float32`.
  * the bare dotted path `module.Class` for a class (not quoted: a quoted string
    is a string value).
  * the bare word `REQUIRED` for the `REQUIRED` marker.
  * `<...>` for anything else (functions, objects): a description only. Reading it
    back is a no-op when it still matches the current value, an error otherwise.

`FromText` never evaluates text and never imports what text names: literals go
through `ast.literal_eval`, the other forms are matched by pattern, and a class path
is looked up without running code (`inspect.getattr_static`) in modules that are
already imported. (TensorFlow itself is imported, lazily, to read `tf.<name>`; this
module does not otherwise need it.)

`str(params)` shows the same value forms, nested and indented like Lingvo's.

Errors: an unknown name raises `AttributeError` with a "did you mean" list; changing
a frozen Params raises `TypeError`; bad names, descriptions and text raise
`ValueError`.
"""

from __future__ import annotations

import ast
import copy
import difflib
import importlib
import inspect
import io
import keyword
import math
import re
import sys
import tokenize
from collections.abc import Iterator
from typing import Any

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# One dotted component of a path: `name` followed by any number of `[i]`.
_COMPONENT_RE = re.compile(r"^([^.\[\]]+)((?:\[\d+\])*)$")
_LINE_RE = re.compile(
    r"^(?P<key>[a-z][a-z0-9_]*(?:\[\d+\])*(?:\.[a-z][a-z0-9_]*(?:\[\d+\])*)*)"
    r"\s*:\s*(?P<value>.*)$"
)
_DTYPE_RE = re.compile(r"^tf\.([a-z][a-z0-9_]*)$")
_CLASS_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


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


REQUIRED = _RequiredMarker()
"""Default for a param that must be set before `InstantiableParams.Instantiate`."""


def _IsDType(value: Any) -> bool:
    # Duck-typed so this module does not need to import TensorFlow.
    cls = type(value)
    return cls.__name__ == "DType" and cls.__module__.startswith("tensorflow")


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


def _ValueText(value: Any) -> str | None:
    """The text `FromText` reads back as `value`, or None if there is none."""
    if value is REQUIRED:
        return "REQUIRED"
    if _IsDType(value):
        return f"tf.{value.name}"
    if isinstance(value, type):
        return _ClassPath(value)
    if type(value) is float and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if _IsPlainLiteral(value):
        return repr(value)
    return None


def _OpaqueText(value: Any) -> str:
    """A stable one-line `<...>` description of a value that has no text form.

    Stable means no memory addresses, so a Copy() is described the same way.
    """
    return f"<{_Describe(value)}>"


def _Describe(value: Any) -> str:
    if type(value) in (list, tuple):
        items = [_ValueText(v) or _Describe(v) for v in value]
        if type(value) is list:
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if type(value) is dict:
        items = [
            f"{_ValueText(k) or _Describe(k)}: {_ValueText(v) or _Describe(v)}"
            for k, v in value.items()
        ]
        return f"{{{', '.join(items)}}}"
    name = getattr(value, "__qualname__", None)
    module = getattr(value, "__module__", None)
    if isinstance(name, str) and isinstance(module, str):
        kind = "class" if isinstance(value, type) else "function"
        return f"{kind} {module}.{name}"
    return f"{type(value).__module__}.{type(value).__qualname__} object"


def _TextOf(value: Any) -> str:
    """The ToText form of `value`: its text form, else its `<...>` description."""
    text = _ValueText(value)
    return _OpaqueText(value) if text is None else text


def _TypeName(value: Any) -> str:
    if value is REQUIRED:
        return "REQUIRED"
    if _IsDType(value):
        return "tf.DType"
    if isinstance(value, type):
        return "class"
    return type(value).__name__


def _ParamsItems(value: Any) -> list[tuple[str, Params]] | None:
    """(suffix, child) pairs if `value` is a Params or a non-empty list/tuple of them."""
    if isinstance(value, Params):
        return [("", value)]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Params) for v in value):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return None


def _CopyValue(value: Any) -> Any:
    """Deep copy, except classes, dtypes and REQUIRED, which are shared."""
    if isinstance(value, Params):
        return value.Copy()
    if type(value) in (list, tuple, set):
        return type(value)(_CopyValue(v) for v in value)
    if type(value) is dict:
        return {k: _CopyValue(v) for k, v in value.items()}
    if value is REQUIRED or _IsDType(value) or isinstance(value, type):
        return value
    return copy.deepcopy(value)  # Functions come back as themselves.


def _ValuesEqual(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays, whose == is element-wise.
        return a is b


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


class _NotLiteralError(ValueError):
    pass


def _ParseValue(text: str) -> Any:
    """Parses one value of the text format; raises _NotLiteralError otherwise."""
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
            raise _NotLiteralError(f"{text!r} is not a TensorFlow dtype") from e
    if _CLASS_PATH_RE.match(text):
        cls = _ResolveClass(text)
        if cls is None:
            raise _NotLiteralError(f"{text!r} does not name a class in an imported module")
        return cls
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise _NotLiteralError(f"{text!r}") from e


def _Coerce(current: Any, new: Any) -> tuple[bool, Any]:
    """Checks `new` (read from text) against the type of `current`.

    Returns (ok, value to store). Only clear mismatches fail: None and REQUIRED fit
    anything, an int fits a float param (stored as float), a list fits a tuple
    param and vice versa (stored as the current container type).
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
    if isinstance(current, Params):
        return False, new  # Only None replaces a nested Params from text.
    for kind in ((str,), (bytes,), (dict,), (set, frozenset), (type,)):
        if isinstance(current, kind):
            return isinstance(new, kind), new
    if _IsDType(current):
        return _IsDType(new), new
    return True, new  # No text form to check against (functions, objects).


def _ExpectedTypeName(current: Any) -> str:
    if isinstance(current, Params):
        return "a nested Params (set its fields as 'key.field : value', or None)"
    if isinstance(current, (list, tuple)):
        return "list or tuple"
    if isinstance(current, float):
        return "float (or int)"
    return _TypeName(current)


class _Param:
    """One defined param: its value and description."""

    __slots__ = ("value", "description")

    def __init__(self, value: Any, description: str) -> None:
        self.value = value
        self.description = description


class Params:
    """A set of named, documented hyper-parameters with attribute access.

    See the module docstring for the text format and error conventions.
    """

    def __init__(self) -> None:
        # Internal state lives in __dict__ directly: __setattr__ is for params only.
        self.__dict__["_params"] = {}
        self.__dict__["_frozen"] = False
        # Dotted path from the root Params this one was last attached under; used
        # in messages only. None for a root.
        self.__dict__["_path"] = None

    # ---- naming and errors -------------------------------------------------------

    def _DisplayName(self) -> str:
        name = self._params.get("name")
        if name is not None and isinstance(name.value, str) and name.value:
            return name.value
        return self._path if self._path is not None else "<root>"

    def _UnknownError(self, key: str) -> AttributeError:
        known = sorted(self._params)
        msg = f"Unknown param {key!r} in Params {self._DisplayName()!r}."
        close = difflib.get_close_matches(key, known)
        if close:
            return AttributeError(f"{msg} Did you mean: {close}?")
        return AttributeError(f"{msg} Known params: {known}")

    def _CheckMutable(self, attempt: str) -> None:
        """Raises if frozen; `attempt` completes "tried to ...", e.g. "set 'dim'"."""
        if self._frozen:
            raise TypeError(
                f"Params {self._DisplayName()!r} is frozen; make a Copy() to change it "
                f"(tried to {attempt})"
            )

    def _Lookup(self, key: str) -> _Param:
        try:
            return self._params[key]
        except KeyError:
            raise self._UnknownError(key) from None

    # ---- nesting -----------------------------------------------------------------

    def _SetPath(self, path: str | None, seen: set[int]) -> None:
        if id(self) in seen:
            return
        seen.add(id(self))
        self.__dict__["_path"] = path
        for key, param in self._params.items():
            for suffix, child in _ParamsItems(param.value) or []:
                child._SetPath(f"{self._Join(key)}{suffix}", seen)

    def _Join(self, key: str) -> str:
        return key if self._path is None else f"{self._path}.{key}"

    def _Attach(self, key: str, value: Any) -> None:
        """Records where nested Params in `value` live, refusing cycles."""
        for suffix, child in _ParamsItems(value) or []:
            if child is self or any(d is self for d in child._Descendants()):
                raise ValueError(
                    f"Cannot set {self._Join(key + suffix)!r}: the value contains "
                    f"Params {self._DisplayName()!r} itself, which would make a cycle."
                )
            child._SetPath(f"{self._Join(key)}{suffix}", set())

    def _Descendants(self) -> Iterator[Params]:
        stack, seen = [self], {id(self)}
        while stack:
            for param in stack.pop()._params.values():
                for _, child in _ParamsItems(param.value) or []:
                    if id(child) not in seen:
                        seen.add(id(child))
                        stack.append(child)
                        yield child

    def _Resolve(self, name: str) -> tuple[Any, str | int]:
        """Walks dotted `name`; returns (container, last step) for its final part.

        The container is a Params (step: a key) or a list/tuple (step: an index).
        """
        steps: list[str | int] = []
        for part in name.split("."):
            match = _COMPONENT_RE.match(part)
            if not match:
                raise ValueError(
                    f"Malformed param name {name!r}; expected 'a.b' or 'layers[1].dim'."
                )
            steps.append(match.group(1))
            steps.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
        node: Any = self
        walked = ""
        for step in steps[:-1]:
            node, walked = self._Step(node, step, walked, name), _Append(walked, step)
        self._Step(node, steps[-1], walked, name)  # Checks that the last step exists.
        return node, steps[-1]

    @staticmethod
    def _Step(node: Any, step: str | int, walked: str, name: str) -> Any:
        if isinstance(step, str):
            if not isinstance(node, Params):
                raise AttributeError(
                    f"Cannot resolve {name!r}: {walked!r} holds a {type(node).__name__}, "
                    f"not a Params, so it has no param {step!r}."
                )
            return node._Lookup(step).value
        if not isinstance(node, (list, tuple)):
            raise AttributeError(
                f"Cannot resolve {name!r}: {walked!r} holds a {type(node).__name__}, "
                f"not a list, so it cannot be indexed with [{step}]."
            )
        if step >= len(node):
            raise AttributeError(
                f"Cannot resolve {name!r}: {walked!r} has {len(node)} items; "
                f"index {step} is out of range."
            )
        return node[step]

    # ---- defining, getting and setting ---------------------------------------------

    def Define(self, name: str, default: Any, description: str) -> None:
        """Defines param `name` with a default value and a (required) description.

        Raises:
          ValueError: `name` is not a lower-case identifier, or `description` is empty.
          AttributeError: `name` is already defined.
          TypeError: this Params is frozen.
        """
        self._CheckMutable(f"define {name!r}")
        if not isinstance(name, str) or not _NAME_RE.match(name) or keyword.iskeyword(name):
            raise ValueError(
                f"Invalid param name {name!r}: expected a lower-case identifier matching "
                f"{_NAME_RE.pattern} that is not a Python keyword."
            )
        if not isinstance(description, str) or not description.strip():
            raise ValueError(
                f"Param {name!r} needs a description (a non-empty str); received {description!r}."
            )
        if name in self._params:
            raise AttributeError(
                f"Param {name!r} is already defined in Params {self._DisplayName()!r}; "
                "set it instead, or Delete() it first."
            )
        self._Attach(name, default)
        self._params[name] = _Param(default, description)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. Underscore names are Python protocol
        # probes (copy, pickle) or internals, never params.
        if name.startswith("_"):
            raise AttributeError(name)
        return self._Lookup(name).value

    def __setattr__(self, name: str, value: Any) -> None:
        self._CheckMutable(f"set {name!r}")
        param = self._Lookup(name)
        self._Attach(name, value)
        param.value = value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._params))

    def Get(self, name: str) -> Any:
        """Returns the value at dotted `name`, e.g. 'atten.dim' or 'layers[1].dim'."""
        node, step = self._Resolve(name)
        return node._Lookup(step).value if isinstance(node, Params) else node[step]

    def Set(self, **kwargs: Any) -> Params:
        """Sets params by (dotted) name and returns self.

        `p.Set(dim=4, **{'atten.dim': 4, 'layers[1].dim': 8})`. All names are checked
        before any value changes.
        """
        targets = []
        for name, value in kwargs.items():
            self._CheckMutable(f"set {name!r}")
            node, step = self._Resolve(name)
            if isinstance(node, Params):
                node._CheckMutable(f"set {name!r}")
            elif not isinstance(node, list):
                raise TypeError(
                    f"Cannot set {name!r}: it is an item of a {type(node).__name__}, which "
                    "cannot change; set the whole container instead."
                )
            targets.append((node, step, value))
        for node, step, value in targets:
            if isinstance(node, Params):
                node._Attach(step, value)
                node._params[step].value = value
            else:
                node[step] = value
        return self

    def Delete(self, *names: str) -> Params:
        """Deletes params by (dotted) name and returns self."""
        targets = []
        for name in names:
            self._CheckMutable(f"delete {name!r}")
            node, step = self._Resolve(name)
            if not isinstance(node, Params):
                raise ValueError(f"Cannot delete {name!r}: it is a list item, not a param.")
            node._CheckMutable(f"delete {name!r}")
            targets.append((node, step))
        for node, step in targets:
            node._params.pop(step, None)
        return self

    def IterParams(self) -> Iterator[tuple[str, Any]]:
        """Yields (name, value) for the top-level params, sorted by name."""
        for name in sorted(self._params):
            yield name, self._params[name].value

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self._Resolve(name)
        except (AttributeError, ValueError):
            return False
        return True

    def __len__(self) -> int:
        return len(self._params)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Params):
            return NotImplemented
        if self._params.keys() != other._params.keys():
            return False
        return all(_ValuesEqual(p.value, other._params[k].value) for k, p in self._params.items())

    __hash__ = None  # Mutable.

    # ---- copying and freezing ------------------------------------------------------

    def Copy(self) -> Params:
        """A deep copy, never frozen. Classes, functions, dtypes and REQUIRED are shared."""
        res = type(self).__new__(type(self))
        Params.__init__(res)
        for key, param in self._params.items():
            value = _CopyValue(param.value)
            res._Attach(key, value)
            res._params[key] = _Param(value, param.description)
        return res

    def __copy__(self) -> Params:
        return self.Copy()

    def __deepcopy__(self, memo: dict) -> Params:
        return self.Copy()

    def Freeze(self) -> Params:
        """Makes this Params and every Params nested in it read-only; returns self.

        Freezing is about params, not values: a list value can still be mutated in
        place. A Params shared with another tree is frozen there too.
        """
        self.__dict__["_frozen"] = True
        for child in self._Descendants():
            child.__dict__["_frozen"] = True
        return self

    def IsFrozen(self) -> bool:
        return self._frozen

    # ---- printing ----------------------------------------------------------------

    def __str__(self) -> str:
        return "\n".join(self._StrLines(0))

    __repr__ = __str__

    def _StrLines(self, depth: int) -> list[str]:
        indent = "  " * (depth + 1)
        lines = ["{"]
        for key, value in self.IterParams():
            items = _ParamsItems(value)
            if items is None:
                lines.append(f"{indent}{key}: {_TextOf(value)}")
                continue
            for suffix, child in items:
                child_lines = child._StrLines(depth + 1)
                lines.append(f"{indent}{key}{suffix}: {child_lines[0]}")
                lines.extend(child_lines[1:])
        lines.append("  " * depth + "}")
        return lines

    def _Flatten(self, prefix: str = "") -> dict[str, Any]:
        """{dotted name: value} for every leaf, nested Params and lists expanded."""
        flat: dict[str, Any] = {}
        for key, value in self.IterParams():
            items = _ParamsItems(value)
            if items is None:
                flat[prefix + key] = value
            for suffix, child in items or []:
                flat.update(child._Flatten(f"{prefix}{key}{suffix}."))
        return flat

    def ToText(self, include_types: bool = False) -> str:
        """Returns `name : value` lines, sorted; see the module docstring for the forms.

        Args:
          include_types: append each value's type as a comment, `dim : 4  # int`.
            `FromText` ignores it.
        """
        lines = []
        for key, value in sorted(self._Flatten().items()):
            line = f"{key} : {_TextOf(value)}"
            lines.append(f"{line}  # {_TypeName(value)}" if include_types else line)
        return "".join(line + "\n" for line in lines)

    def FromText(self, text: str) -> Params:
        """Sets values from `ToText`-style text; returns self.

        Blank lines and `#` comments are ignored. Every line is parsed and checked
        before any value changes. Values are never evaluated as code.

        Raises:
          AttributeError: a name is not defined (with a "did you mean" list).
          ValueError: a line is malformed, its value is not a literal (or dtype,
            class path, REQUIRED), or its type clearly does not fit the param.
          TypeError: this Params is frozen.
        """
        self._CheckMutable("set params from text")
        updates: dict[str, Any] = {}
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = _LINE_RE.match(line)
            if not match:
                raise ValueError(f"FromText line {lineno}: expected 'name : value'; got {line!r}.")
            key, value_text = match.group("key"), _StripComment(match.group("value"))
            try:
                value = _ParseValue(value_text)
            except _NotLiteralError as e:
                # Parsed before the name is looked up, so that text trying to run code
                # is reported as such whatever name it uses.
                current = self.Get(key) if key in self else None
                if _ValueText(current) is None and value_text == _OpaqueText(current):
                    continue  # ToText's description of a value it cannot write.
                raise ValueError(
                    f"FromText line {lineno}: value for {key!r} is not a literal: {e}. "
                    "Accepted: Python literals, REQUIRED, inf/nan, tf.<dtype>, and dotted "
                    "paths of classes in imported modules."
                ) from None
            current = self.Get(key)
            ok, value = _Coerce(current, value)
            if not ok:
                raise ValueError(
                    f"FromText line {lineno}: param {key!r} expects "
                    f"{_ExpectedTypeName(current)}; received {value_text} "
                    f"({_TypeName(value)})."
                )
            updates[key] = value
        return self.Set(**updates)

    def TextDiff(self, other: Params) -> str:
        """Describes where `other` differs from self; '' when they are equal.

        One line per differing leaf, in `ToText` form and sorted by name: `> name :
        value` gives self's value and `< name : value` other's. A name present on one
        side only gets only that side's line.
        """
        mine, theirs = self._Flatten(), other._Flatten()
        lines = []
        for key in sorted(mine.keys() | theirs.keys()):
            if key in mine and key in theirs and _ValuesEqual(mine[key], theirs[key]):
                continue
            for mark, flat in ((">", mine), ("<", theirs)):
                if key in flat:
                    lines.append(f"{mark} {key} : {_TextOf(flat[key])}")
        return "".join(line + "\n" for line in lines)

    def _RequiredPaths(self, prefix: str = "") -> list[str]:
        """Dotted names of every value in the tree that is still REQUIRED."""
        paths: list[str] = []

        def Visit(value: Any, path: str) -> None:
            if value is REQUIRED:
                paths.append(path)
            elif isinstance(value, Params):
                paths.extend(value._RequiredPaths(path + "."))
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    Visit(item, f"{path}[{i}]")

        for key, value in self.IterParams():
            Visit(value, prefix + key)
        return paths


def _Append(walked: str, step: str | int) -> str:
    if isinstance(step, int):
        return f"{walked}[{step}]"
    return f"{walked}.{step}" if walked else step


class InstantiableParams(Params):
    """Params with a `cls` param: the class that `Instantiate` builds from them."""

    def __init__(self, cls: type | None = None) -> None:
        super().__init__()
        self.Define("cls", cls, "The class to build: Instantiate() calls cls(params, ...).")

    def Instantiate(self, **kwargs: Any) -> Any:
        """Returns `self.cls(self, **kwargs)` once every REQUIRED param is set.

        Raises:
          ValueError: `cls` is None, or a param anywhere in the tree is REQUIRED.
        """
        if self.cls is None:
            raise ValueError(
                f"Cannot Instantiate Params {self._DisplayName()!r}: 'cls' is None; "
                "set p.cls to the class to build."
            )
        missing = self._RequiredPaths()
        if missing:
            owner = getattr(self.cls, "__name__", repr(self.cls))
            if len(missing) == 1:
                what = f"required param {missing[0]!r} was not set. Set it"
            else:
                what = f"required params {', '.join(map(repr, missing))} were not set. Set them"
            raise ValueError(f"Params for {owner}: {what} before Instantiate().")
        return self.cls(self, **kwargs)

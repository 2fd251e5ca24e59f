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
    is a string value). `FromText` accepts only a class that fits the param: a
    subclass of its base, which is `Define(..., base=...)` when given, else inferred
    from the class the param was defined with (`params_text.ExpectedBase`: the
    nearest lingpipe base class, BaseTask, BaseLayer, BaseInputGenerator,
    BaseOptimizer or BaseSchedule; else the root of that class's `Params()` family).
    A param defined without a class accepts subclasses of any lingpipe base. So
    `train.lr_schedule.cls : subprocess.Popen` is refused, naming the param, the
    class received and the base expected.
  * the bare word `REQUIRED` for the `REQUIRED` marker.
  * `<...>` for anything else (functions, objects): a description only. Reading it
    back is a no-op when it still matches the current value, an error otherwise.

`FromText` never evaluates text and never imports what text names: literals go
through `ast.literal_eval`, the other forms are matched by pattern, and a class path
is looked up without running code (`inspect.getattr_static`) in modules that are
already imported. (TensorFlow itself is imported, lazily, to read `tf.<name>`; this
module does not otherwise need it.) The format is implemented in `lingpipe.params_text`.

`str(params)` shows the same value forms, nested and indented like Lingvo's.

Errors: an unknown name raises `AttributeError` with a "did you mean" list; changing
a frozen Params raises `TypeError`; bad names, descriptions and text raise
`ValueError`.
"""

from __future__ import annotations

import copy
import difflib
import keyword
import re
from collections.abc import Iterator
from typing import Any

from lingpipe import params_text
from lingpipe.params_text import REQUIRED  # A value of the text format, defined there.

__all__ = [
    "CheckInstantiable",
    "InstantiableParams",
    "Params",
    "REQUIRED",
]

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# One dotted component of a path: `name` followed by any number of `[i]`.
_COMPONENT_RE = re.compile(r"^([^.\[\]]+)((?:\[\d+\])*)$")


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
    if value is REQUIRED or params_text.IsDType(value) or isinstance(value, type):
        return value
    return copy.deepcopy(value)  # Functions come back as themselves.


def _ValuesEqual(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays, whose == is element-wise.
        return a is b


class _Param:
    """One defined param: its value, description, the base class a class value read
    from text must derive from (None: no class to infer it from), and the types text
    may give it whatever its value (empty: the value's type decides, params_text.Coerce)."""

    __slots__ = ("value", "description", "base", "text_types")

    def __init__(
        self, value: Any, description: str, base: type | None, text_types: tuple = ()
    ) -> None:
        self.value = value
        self.description = description
        self.base = base
        self.text_types = text_types


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

    def Define(
        self,
        name: str,
        default: Any,
        description: str,
        *,
        base: type | None = None,
        text_types: tuple[type, ...] = (),
    ) -> None:
        """Defines param `name` with a default value and a (required) description.

        Args:
          name: a lower-case identifier.
          default: the initial value.
          description: what the param means; required.
          base: for a class-valued param, the class that `FromText` requires a class
            value to derive from. By default it is inferred from a class `default`
            (see the module docstring); declare it when the default is None.
          text_types: the types `FromText` accepts for the param whatever its current
            value, for a param that takes more than one (a policy name, or a list of
            them with one per stage: `(str, list, tuple)`). By default the current
            value's type decides (`params_text.Coerce`).

        Raises:
          ValueError: `name` is not a lower-case identifier, `description` is empty,
            or `default` is a class that is not a subclass of `base`.
          AttributeError: `name` is already defined.
          TypeError: this Params is frozen, or `base` is not a class.
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
        base = _DefinedBase(name, default, base)
        self._params[name] = _Param(default, description, base, tuple(text_types))

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
            res._params[key] = _Param(value, param.description, param.base, param.text_types)
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
                lines.append(f"{indent}{key}: {params_text.TextOf(value)}")
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
            line = f"{key} : {params_text.TextOf(value)}"
            lines.append(f"{line}  # {params_text.TypeName(value)}" if include_types else line)
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
            parts = params_text.SplitLine(line)
            if parts is None:
                raise ValueError(f"FromText line {lineno}: expected 'name : value'; got {line!r}.")
            key, value_text = parts
            try:
                value = params_text.ParseValue(value_text)
            except params_text.NotLiteralError as e:
                # Parsed before the name is looked up, so that text trying to run code
                # is reported as such whatever name it uses.
                current = self.Get(key) if key in self else None
                no_text = params_text.ValueText(current) is None
                if no_text and value_text == params_text.OpaqueText(current):
                    continue  # ToText's description of a value it cannot write.
                raise ValueError(
                    f"FromText line {lineno}: value for {key!r} is not a literal: {e}. "
                    "Accepted: Python literals, REQUIRED, inf/nan, tf.<dtype>, and dotted "
                    "paths of classes in imported modules."
                ) from None
            current = self.Get(key)
            ok, value = _Coerce(current, value)
            text_types = self._TextTypes(key)
            if not ok and not isinstance(value, text_types):
                expected = _ExpectedTypeName(current, text_types)
                raise ValueError(
                    f"FromText line {lineno}: param {key!r} expects {expected}; received "
                    f"{value_text} ({params_text.TypeName(value)})."
                )
            if isinstance(value, type) and value is not current:
                error = params_text.ClassError(key, value, self._ClassBase(key, current))
                if error is not None:
                    raise ValueError(f"FromText line {lineno}: {error}")
            updates[key] = value
        return self.Set(**updates)

    def _TextTypes(self, name: str) -> tuple[type, ...]:
        """The types FromText accepts for dotted `name` whatever its value; see Define."""
        node, step = self._Resolve(name)
        return node._params[step].text_types if isinstance(node, Params) else ()

    def _ClassBase(self, name: str, current: Any) -> type | None:
        """The base class a class value of dotted `name` must derive from; see Define."""
        node, step = self._Resolve(name)
        if isinstance(node, Params) and node._params[step].base is not None:
            return node._params[step].base
        return params_text.ExpectedBase(current) if isinstance(current, type) else None

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
                    lines.append(f"{mark} {key} : {params_text.TextOf(flat[key])}")
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


def _Coerce(current: Any, new: Any) -> tuple[bool, Any]:
    """params_text.Coerce, and a nested Params, which only None or REQUIRED replaces."""
    if isinstance(current, Params):
        return new is None or new is REQUIRED, new
    return params_text.Coerce(current, new)


def _ExpectedTypeName(current: Any, text_types: tuple[type, ...]) -> str:
    """params_text.ExpectedTypeName, and what a nested Params takes from text."""
    if isinstance(current, Params) and not text_types:
        return "a nested Params (set its fields as 'key.field : value', or None)"
    return params_text.ExpectedTypeName(current, text_types)


def _DefinedBase(name: str, default: Any, base: type | None) -> type | None:
    """The base of a param defined with `default`: `base` if given (checked), else
    inferred from a class default, else None."""
    if base is None:
        return params_text.ExpectedBase(default) if isinstance(default, type) else None
    if not isinstance(base, type):
        raise TypeError(f"Param {name!r}: base must be a class, received {base!r}")
    if isinstance(default, type) and not issubclass(default, base):
        raise ValueError(
            f"Param {name!r}: default {params_text.ClassName(default)} is not a subclass "
            f"of its base {params_text.ClassName(base)}"
        )
    return base


def _Append(walked: str, step: str | int) -> str:
    if isinstance(step, int):
        return f"{walked}[{step}]"
    return f"{walked}.{step}" if walked else step


def CheckInstantiable(params: Any, owner: object) -> None:
    """Raises a TypeError unless `params` are InstantiableParams; `owner` is the object
    being built from them, named in the message with the Params() call to use."""
    if not isinstance(params, InstantiableParams):
        name = type(owner).__name__
        raise TypeError(
            f"{name}: expected InstantiableParams (from {name}.Params()), received "
            f"{type(params).__name__}"
        )


class InstantiableParams(Params):
    """Params with a `cls` param: the class that `Instantiate` builds from them."""

    def __init__(self, cls: type | None = None, *, base: type | None = None) -> None:
        """`cls`: the class to build; `base`: the class a `cls` read from text must
        derive from (default: inferred from `cls`, see the module docstring)."""
        super().__init__()
        self.Define(
            "cls", cls, "The class to build: Instantiate() calls cls(params, ...).", base=base
        )

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

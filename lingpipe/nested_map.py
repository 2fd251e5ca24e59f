"""NestedMap: a dict with attribute access that tf.nest treats as a mapping.

`NestedMap` is Lingvo's container for layer inputs, outputs and `theta`:

    m = NestedMap(x=tf.zeros([2, 3]))
    m.y = NestedMap(z=tf.ones([4]))
    m.Flatten()          # [m.x, m.y.z], in tf.nest order (keys sorted)
    m.GetItem('y.z')     # m.y.z

Keys must be identifiers (so `m.key` reaches them) and must not shadow a
method (`m.keys = 1` is refused). Being a `dict` subclass, a NestedMap goes
through `tf.nest` and `tf.function` as a mapping and comes back as a NestedMap.

The structural methods (`Flatten`, `Pack`, `Transform`, `Filter`, ...) descend
into dicts (NestedMap or plain), lists and tuples (namedtuples included), in
the order tf.nest uses: dict keys sorted, sequences in order. Everything else
is a leaf, including None.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = [
    "NestedMap",
]

_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# One part of a dotted key: a name followed by any number of list indices, as
# `FlattenItems` writes them (`a.b[1][0].c`).
_KEY_PART_PATTERN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)")
_INDEX_PATTERN = re.compile(r"\[(\d+)\]")

# Returned by a leaf function to drop that leaf (used by Filter).
_DROP = object()


def _IsNamedTuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _JoinKey(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _Children(x: Any, prefix: str) -> list[tuple[Any, str, Any]] | None:
    """Returns [(child_id, child_key, child)] of a container, or None for a leaf.

    child_id is the dict key or sequence index, child_key the dotted key of the
    child ('a.b', 'a[0]'); children come in tf.nest order (dict keys sorted).
    """
    if isinstance(x, dict):
        return [(k, _JoinKey(prefix, k), x[k]) for k in sorted(x)]
    if isinstance(x, (list, tuple)):
        return [(i, f"{prefix}[{i}]", v) for i, v in enumerate(x)]
    return None


def _IterLeaves(x: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    children = _Children(x, prefix)
    if children is None:
        yield prefix, x
        return
    for _, child_key, child in children:
        yield from _IterLeaves(child, child_key)


def _Rebuild(original: Any, kept: list[tuple[Any, Any]], prefix: str) -> Any:
    """Builds a container of the same type as `original` from (child_id, value) pairs."""
    if isinstance(original, dict):
        values = dict(kept)
        # Keep the original insertion order; only the traversal is sorted.
        ordered = [(k, values[k]) for k in original if k in values]
        if isinstance(original, NestedMap) or type(original) is dict:
            return type(original)(ordered)
        # Other dict subclasses (OrderedDict, defaultdict, ...): keep their extra state.
        new = copy.copy(original)
        new.clear()
        new.update(ordered)
        return new
    values = [v for _, v in kept]
    if _IsNamedTuple(original):
        if len(values) != len(original):
            raise ValueError(
                f"NestedMap: cannot drop some fields of the namedtuple "
                f"{type(original).__name__} at {prefix!r} (kept {len(values)} of "
                f"{len(original)}); filter whole namedtuples or convert it to a tuple"
            )
        return type(original)(*values)
    return type(original)(values)


def _MapLeaves(x: Any, prefix: str, fn: Callable[[str, Any], Any]) -> Any:
    """Rebuilds `x` with fn(key, leaf) at each leaf.

    A leaf for which fn returns _DROP is left out; a container that loses all its
    children that way is dropped too (returns _DROP). A container that was empty
    to begin with is kept.
    """
    children = _Children(x, prefix)
    if children is None:
        return fn(prefix, x)
    kept = []
    for child_id, child_key, child in children:
        value = _MapLeaves(child, child_key, fn)
        if value is not _DROP:
            kept.append((child_id, value))
    if children and not kept:
        return _DROP
    return _Rebuild(x, kept, prefix)


def _SameStructure(a: Any, b: Any) -> bool:
    a_is_map, b_is_map = isinstance(a, dict), isinstance(b, dict)
    if a_is_map or b_is_map:
        if not (a_is_map and b_is_map) or set(a) != set(b):
            return False
        return all(_SameStructure(a[k], b[k]) for k in a)
    a_is_seq, b_is_seq = isinstance(a, (list, tuple)), isinstance(b, (list, tuple))
    if a_is_seq or b_is_seq:
        if not (a_is_seq and b_is_seq) or len(a) != len(b):
            return False
        return all(_SameStructure(u, v) for u, v in zip(a, b))
    return True


def _ParseKey(key: str) -> list[str | int]:
    """Splits 'a.b[1].c' into ['a', 'b', 1, 'c']."""
    if not isinstance(key, str) or not key:
        raise ValueError(
            f"NestedMap: a nested key must be a non-empty str such as 'a.b[0].c'; received {key!r}"
        )
    steps: list[str | int] = []
    for part in key.split("."):
        match = _KEY_PART_PATTERN.fullmatch(part)
        if not match:
            raise ValueError(
                f"NestedMap: invalid nested key {key!r}: part {part!r} is not an "
                f"identifier optionally followed by list indices such as 'name[0]'"
            )
        steps.append(match.group(1))
        steps.extend(int(i) for i in _INDEX_PATTERN.findall(match.group(2)))
    return steps


def _StepKey(prefix: str, step: str | int) -> str:
    return f"{prefix}[{step}]" if isinstance(step, int) else _JoinKey(prefix, step)


def _Where(prefix: str) -> str:
    return repr(prefix) if prefix else "the top level"


class NestedMap(dict):
    """A dict whose keys are also attributes: `m.x` is `m['x']`.

    Keys must be str identifiers that do not name a dict or NestedMap attribute
    (`keys`, `items`, `Flatten`, ...) nor a dunder; both are checked on every
    insertion (`m.x = v`, `m['x'] = v`, the constructor, `update`, `setdefault`,
    `|=`) and raise ValueError naming the key.
    """

    # All attribute names of the class; a key with one of these names would be
    # hidden behind the attribute. Filled in after the class body (and per subclass).
    _RESERVED_KEYS: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._RESERVED_KEYS = frozenset(dir(cls))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Same arguments as `dict(...)`; every key is checked with `CheckKey`."""
        items = dict(*args, **kwargs)
        for key in items:
            self._CheckKeyForThisClass(key)
        super().__init__(items)

    # --- Key checks -------------------------------------------------------------

    @staticmethod
    def CheckKey(key: Any) -> None:
        """Raises ValueError unless `key` can be a NestedMap key.

        A key must be a str matching `[A-Za-z_][A-Za-z0-9_]*`, must not be a dunder
        (`__x__`) and must not be the name of a dict or NestedMap attribute.
        """
        if not isinstance(key, str):
            raise ValueError(
                f"NestedMap keys must be str; received {key!r} of type {type(key).__name__}"
            )
        if not _KEY_PATTERN.fullmatch(key):
            raise ValueError(
                f"NestedMap key {key!r} is not a valid identifier; keys must match "
                f"[A-Za-z_][A-Za-z0-9_]* so that they can be read as attributes"
            )
        if key in NestedMap._RESERVED_KEYS or (key.startswith("__") and key.endswith("__")):
            raise ValueError(
                f"NestedMap key {key!r} is reserved: it names a dict/NestedMap "
                f"attribute or a Python protocol, so m.{key} would not reach it; "
                f"choose another name"
            )

    def _CheckKeyForThisClass(self, key: Any) -> None:
        NestedMap.CheckKey(key)
        if key in type(self)._RESERVED_KEYS:
            raise ValueError(
                f"NestedMap key {key!r} is reserved: it names an attribute of "
                f"{type(self).__name__}, so m.{key} would not reach it; choose another name"
            )

    # --- dict and attribute access ----------------------------------------------

    def __setitem__(self, key: str, value: Any) -> None:
        self._CheckKeyForThisClass(key)
        super().__setitem__(key, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(self._MissingKeyMessage(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(self._MissingKeyMessage(name)) from None

    def _MissingKeyMessage(self, name: str) -> str:
        keys = sorted(self.keys())
        close = difflib.get_close_matches(name, keys, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"NestedMap has no key {name!r}{hint}; available keys: {keys}"

    def __dir__(self) -> list[str]:
        return list(super().__dir__()) + list(self.keys())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({super().__repr__()})"

    # dict's own versions of these bypass __setitem__ (and so the key checks) or
    # return a plain dict.

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Like `dict.update`, with every key checked before any is inserted."""
        items = dict(*args, **kwargs)
        for key in items:
            self._CheckKeyForThisClass(key)
        super().update(items)

    def setdefault(self, key: str, default: Any = None) -> Any:
        """Like `dict.setdefault`, with the key checked."""
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self) -> NestedMap:
        """Like `dict.copy`: a new top-level NestedMap sharing all values. See `Copy`."""
        return type(self)(self)

    def __or__(self, other: Any) -> NestedMap:
        if not isinstance(other, dict):
            return NotImplemented
        result = self.copy()
        result.update(other)
        return result

    def __ror__(self, other: Any) -> NestedMap:
        if not isinstance(other, dict):
            return NotImplemented
        result = type(self)(other)
        result.update(self)
        return result

    def __ior__(self, other: Any) -> NestedMap:
        self.update(other)
        return self

    # --- Construction -------------------------------------------------------------

    @staticmethod
    def FromNestedDict(x: Any) -> Any:
        """Returns `x` with every dict in it, at any depth, turned into a NestedMap.

        Descends into dicts, lists and tuples; a top-level dict gives a NestedMap.
        Raises ValueError if a dict key is not a valid NestedMap key.
        """
        if isinstance(x, dict):
            return NestedMap({k: NestedMap.FromNestedDict(v) for k, v in x.items()})
        if _IsNamedTuple(x):
            return type(x)(*(NestedMap.FromNestedDict(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(NestedMap.FromNestedDict(v) for v in x)
        return x

    def Copy(self) -> NestedMap:
        """Returns a copy of the structure (new NestedMaps, dicts, lists) with the same leaves."""
        return self.Transform(lambda v: v)

    def DeepCopy(self) -> NestedMap:
        """Returns a deep copy: the structure and the leaves (`copy.deepcopy`)."""
        return copy.deepcopy(self)

    # --- Structure ------------------------------------------------------------

    def Flatten(self) -> list[Any]:
        """Returns the leaves in tf.nest order: `Flatten() == tf.nest.flatten(self)`."""
        return [v for _, v in _IterLeaves(self, "")]

    def FlattenItems(self) -> list[tuple[str, Any]]:
        """Returns [(key, leaf)] in `Flatten` order; keys look like 'a.b[1].c'."""
        return list(_IterLeaves(self, ""))

    def Pack(self, flat: Sequence[Any]) -> NestedMap:
        """Returns a new structure shaped like this one with the leaves of `flat`.

        Args:
          flat: the new leaves, in `Flatten` order; as many as this map has leaves.

        Raises:
          ValueError: if `len(flat)` differs from the number of leaves.
        """
        flat = list(flat)
        num_leaves = len(self.Flatten())
        if len(flat) != num_leaves:
            raise ValueError(
                f"NestedMap.Pack: received {len(flat)} values but this NestedMap has "
                f"{num_leaves} leaves (keys: {[k for k, _ in self.FlattenItems()]})"
            )
        leaves = iter(flat)
        return _MapLeaves(self, "", lambda _, __: next(leaves))

    def Transform(self, fn: Callable[[Any], Any]) -> NestedMap:
        """Returns a new structure with `fn(leaf)` in place of every leaf."""
        return _MapLeaves(self, "", lambda _, v: fn(v))

    def TransformWithKey(self, fn: Callable[[str, Any], Any]) -> NestedMap:
        """Returns a new structure with `fn(key, leaf)` in place of every leaf."""
        return _MapLeaves(self, "", fn)

    def Filter(self, fn: Callable[[Any], bool]) -> NestedMap:
        """Returns a new structure with only the leaves for which `fn(leaf)` is true.

        A NestedMap, dict, list or tuple left empty by the filter is dropped (an
        empty one that had no leaves to begin with is kept). A namedtuple can be
        dropped whole but not in part: that raises ValueError.
        """
        return self.FilterKeyVal(lambda _, v: fn(v))

    def FilterKeyVal(self, fn: Callable[[str, Any], bool]) -> NestedMap:
        """Like `Filter`, with `fn(key, leaf)`; key as in `FlattenItems`."""
        result = _MapLeaves(self, "", lambda k, v: v if fn(k, v) else _DROP)
        return type(self)() if result is _DROP else result

    def IsCompatible(self, other: Any) -> bool:
        """True if `other` has the same structure, ignoring the leaves.

        Same structure: the same keys at every level and sequences of the same
        length. Container types are not compared (a dict matches a NestedMap, a
        list a tuple), as with `tf.nest.assert_same_structure(check_types=False)`.
        """
        return isinstance(other, dict) and _SameStructure(self, other)

    def DebugString(self) -> str:
        """Returns one 'key  value' line per leaf, in `FlattenItems` (sorted) order."""
        items = self.FlattenItems()
        width = max((len(k) for k, _ in items), default=0)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in items)

    # --- Dotted keys ------------------------------------------------------------

    def GetItem(self, key: str) -> Any:
        """Returns the value at a dotted key such as 'a.b' or 'a.b[1].c'.

        Raises:
          ValueError: if `key` is malformed.
          KeyError: if a dict on the path lacks the key.
          IndexError: if a list index on the path is out of range.
          TypeError: if the path goes through a leaf.
        """
        current: Any = self
        walked = ""
        for step in _ParseKey(key):
            if isinstance(step, str):
                if not isinstance(current, dict):
                    raise TypeError(
                        f"NestedMap.GetItem({key!r}): {_Where(walked)} is a "
                        f"{type(current).__name__}, not a dict, so it has no key {step!r}"
                    )
                if step not in current:
                    raise KeyError(
                        f"NestedMap.GetItem({key!r}): no key {step!r} in {_Where(walked)}; "
                        f"available keys: {sorted(str(k) for k in current)}"
                    )
            else:
                if not isinstance(current, (list, tuple)):
                    raise TypeError(
                        f"NestedMap.GetItem({key!r}): {_Where(walked)} is a "
                        f"{type(current).__name__}, not a list or tuple, so it has no "
                        f"index {step}"
                    )
                if step >= len(current):
                    raise IndexError(
                        f"NestedMap.GetItem({key!r}): index {step} is out of range for "
                        f"{_Where(walked)} of length {len(current)}"
                    )
            current = current[step]
            walked = _StepKey(walked, step)
        return current

    def Get(self, key: str, default: Any = None) -> Any:
        """Returns the value at a dotted key, or `default` if there is none.

        Raises ValueError if `key` is malformed.
        """
        try:
            return self.GetItem(key)
        except (KeyError, IndexError, TypeError):
            return default

    def Set(self, key: str, value: Any) -> None:
        """Sets the value at a dotted key, creating missing NestedMaps on the way.

        `m.Set('a.b.c', 1)` creates `m.a` and `m.a.b` if needed. Indices are
        allowed where a list exists or can be created: `m.Set('a[0]', v)` creates
        `m.a = [v]`; an index may replace an item or append at the end of a list.

        Raises:
          ValueError: if `key` is malformed or reserved, the path goes through a
            leaf or a tuple, or an index is past the end of its list.
        """
        steps = _ParseKey(key)
        current: Any = self
        walked = ""
        for step, next_step in zip(steps, steps[1:] + [None]):
            if next_step is None:
                item = value
            else:
                item = NestedMap() if isinstance(next_step, str) else []
            if isinstance(step, str):
                if not isinstance(current, dict):
                    raise ValueError(
                        f"NestedMap.Set({key!r}): cannot set key {step!r} in "
                        f"{_Where(walked)}, which is a {type(current).__name__}, "
                        f"not a NestedMap or dict"
                    )
                if next_step is None or step not in current:
                    current[step] = item
            else:
                if not isinstance(current, list):
                    raise ValueError(
                        f"NestedMap.Set({key!r}): cannot set index {step} in "
                        f"{_Where(walked)}, which is a {type(current).__name__}, not a list"
                    )
                if step > len(current):
                    raise ValueError(
                        f"NestedMap.Set({key!r}): index {step} is past the end of "
                        f"{_Where(walked)} (length {len(current)}); set index "
                        f"{len(current)} first"
                    )
                if step == len(current):
                    current.append(item)
                elif next_step is None:
                    current[step] = item
            current = current[step]
            walked = _StepKey(walked, step)


NestedMap._RESERVED_KEYS = frozenset(dir(NestedMap))

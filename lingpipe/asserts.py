"""Checks that raise ValueError with the names and values involved.

Library code validates with these (or a plain `raise ValueError`), never with a
bare `assert`, which vanishes under `python -O` and prints no values. Each check
takes an optional `where` (usually a layer path) that leads the message, and an
optional `hint` that says how to fix the problem.

    asserts.Eq(p.input_dims, x.shape[-1], 'input_dims', 'inputs.shape[-1]',
               where=self.path)
    -> ValueError: model/fc: expected input_dims == inputs.shape[-1], received
       input_dims=8, inputs.shape[-1]=6
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "DivisibleBy",
    "Eq",
    "Ge",
    "Gt",
    "In",
    "Le",
    "Lt",
    "Ne",
    "NotNone",
    "Positive",
]


def _Fail(message: str, where: str | None, hint: str | None) -> None:
    text = f"{where}: {message}" if where else message
    if hint:
        text += f"; {hint}"
    raise ValueError(text)


def _Compare(
    ok: bool,
    op: str,
    a: Any,
    b: Any,
    a_name: str,
    b_name: str | None,
    where: str | None,
    hint: str | None,
) -> None:
    if ok:
        return
    if b_name is None:
        _Fail(f"expected {a_name} {op} {b!r}, received {a_name}={a!r}", where, hint)
    _Fail(f"expected {a_name} {op} {b_name}, received {a_name}={a!r}, {b_name}={b!r}", where, hint)


def Eq(
    a: Any,
    b: Any,
    a_name: str = "a",
    b_name: str | None = None,
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless a == b."""
    _Compare(a == b, "==", a, b, a_name, b_name, where, hint)


def Ne(
    a: Any,
    b: Any,
    a_name: str = "a",
    b_name: str | None = None,
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless a != b."""
    _Compare(a != b, "!=", a, b, a_name, b_name, where, hint)


def Gt(
    a: Any,
    b: Any,
    a_name: str = "a",
    b_name: str | None = None,
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless a > b."""
    _Compare(a > b, ">", a, b, a_name, b_name, where, hint)


def Ge(
    a: Any,
    b: Any,
    a_name: str = "a",
    b_name: str | None = None,
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless a >= b."""
    _Compare(a >= b, ">=", a, b, a_name, b_name, where, hint)


def Lt(
    a: Any,
    b: Any,
    a_name: str = "a",
    b_name: str | None = None,
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless a < b."""
    _Compare(a < b, "<", a, b, a_name, b_name, where, hint)


def Le(
    a: Any,
    b: Any,
    a_name: str = "a",
    b_name: str | None = None,
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless a <= b."""
    _Compare(a <= b, "<=", a, b, a_name, b_name, where, hint)


def In(
    value: Any,
    allowed: Iterable[Any],
    name: str = "value",
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless value is one of `allowed`."""
    allowed = list(allowed)
    if value not in allowed:
        _Fail(f"expected {name} to be one of {allowed!r}, received {name}={value!r}", where, hint)


def Positive(
    value: Any, name: str = "value", *, where: str | None = None, hint: str | None = None
) -> None:
    """Raises ValueError unless value is an int > 0 (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _Fail(f"expected {name} to be a positive integer, received {name}={value!r}", where, hint)


def DivisibleBy(
    value: int,
    divisor: int,
    value_name: str = "value",
    divisor_name: str = "divisor",
    *,
    where: str | None = None,
    hint: str | None = None,
) -> None:
    """Raises ValueError unless value % divisor == 0."""
    if divisor == 0 or value % divisor:
        _Fail(
            f"expected {value_name} to be divisible by {divisor_name}, received "
            f"{value_name}={value!r}, {divisor_name}={divisor!r}",
            where,
            hint,
        )


def NotNone(
    value: Any, name: str = "value", *, where: str | None = None, hint: str | None = None
) -> None:
    """Raises ValueError if value is None (an unset param, usually)."""
    if value is None:
        _Fail(f"expected {name} to be set, received {name}=None", where, hint)

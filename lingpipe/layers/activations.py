"""Activation functions by name, as layer params name them ('RELU', 'GELU', ...)."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

__all__ = [
    "Check",
    "FlopsPerElement",
    "GetFn",
    "NAMES",
]

_ACTIVATIONS: dict[str, Callable[[tf.Tensor], tf.Tensor]] = {
    "NONE": tf.identity,
    "RELU": tf.nn.relu,
    "RELU6": tf.nn.relu6,
    "GELU": tf.nn.gelu,
    "TANH": tf.tanh,
    "SIGMOID": tf.sigmoid,
    "SWISH": tf.nn.silu,
    "SILU": tf.nn.silu,
}

NAMES = tuple(_ACTIVATIONS)

# Rough FLOPs per element, for FPropMeta.
_FLOPS = {"NONE": 0, "RELU": 1, "RELU6": 2, "GELU": 8, "TANH": 5, "SIGMOID": 4}


def Check(name: str, where: str = "") -> str:
    """Returns the canonical (upper-case) name, or raises ValueError listing the known ones."""
    key = name.upper() if isinstance(name, str) else name
    if key not in _ACTIVATIONS:
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}unknown activation {name!r}; expected one of {list(NAMES)} (case-insensitive)"
        )
    return key


def GetFn(name: str, where: str = "") -> Callable[[tf.Tensor], tf.Tensor]:
    """The function for activation `name` (case-insensitive)."""
    return _ACTIVATIONS[Check(name, where)]


def FlopsPerElement(name: str) -> int:
    return _FLOPS.get(Check(name), 5)

"""Layers that run other layers one after another: SequentialLayer and RepeatLayer.

Each child receives the previous child's outputs: a tuple is splatted into
positional arguments, any other value (a tensor, a NestedMap) is passed as the
single argument. The result is the last child's output.

    p = SequentialLayer.Params().Set(name='mlp', sub=[fc1_p, fc2_p])
    y = p.Instantiate()(x)  # fc2(fc1(x))

    p = RepeatLayer.Params().Set(name='rep', body=block_p, repeat=4)
    # Four copies of the block, each with its own weights: rep/body_0 .. rep/body_3.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.nested_map import NestedMap

__all__ = [
    "AsArgs",
    "ChainMeta",
    "RepeatLayer",
    "RunChain",
    "SequentialLayer",
]


def AsArgs(outputs: Any) -> tuple:
    """The positional arguments that `outputs` becomes for the next child."""
    return outputs if isinstance(outputs, tuple) else (outputs,)


def RunChain(
    children: Sequence[base_layer.BaseLayer], thetas: Sequence[NestedMap], args: tuple
) -> Any:
    """Runs `children` in order, each on the previous one's outputs."""
    outputs = args
    for child, theta in zip(children, thetas):
        outputs = child.FProp(theta, *AsArgs(outputs))
    return outputs


def ChainMeta(
    parent_p: hyperparams.Params,
    params_list: Sequence[hyperparams.InstantiableParams],
    input_shapes: tuple,
) -> NestedMap:
    """Chains the FPropMeta of `params_list`: out_shapes of one are the next one's inputs."""
    shapes = tuple(base_layer.NormShape(s) for s in input_shapes)
    flops = num_params = 0
    for child_p in params_list:
        # The child as the parent would build it: it inherits the parent's base params.
        child_p = base_layer.BaseLayer.CopyBaseParams(parent_p, child_p.Copy())
        meta = child_p.cls.FPropMeta(child_p, *shapes)
        shapes = tuple(meta.out_shapes)
        flops += meta.flops
        num_params += meta.num_params
    return base_layer.Meta(shapes, flops, num_params)


def _CheckSub(sub: Any, where: str) -> None:
    if not isinstance(sub, (list, tuple)) or not sub:
        raise ValueError(
            f"{where}: expected sub to be a non-empty list of layer params, received sub={sub!r}"
        )


def _CheckRepeat(body: Any, repeat: Any, where: str) -> None:
    if not isinstance(body, hyperparams.InstantiableParams):
        raise ValueError(f"{where}: expected body to be layer params, received body={body!r}")
    asserts.Positive(repeat, "repeat", where=where)


class SequentialLayer(base_layer.BaseLayer):
    """Runs the layers of `sub` in order, each on the previous one's outputs."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("sub", [], "List of layer params, run in order. Unnamed ones become sub_<i>.")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        _CheckSub(p.sub, self.path)
        names = [getattr(sub_p, "name", None) or f"sub_{i}" for i, sub_p in enumerate(p.sub)]
        if len(set(names)) != len(names):
            raise ValueError(
                f"{self.path}: expected the layers of sub to have distinct names, "
                f"received names={names}"
            )
        self.CreateChildren("sub", list(p.sub))

    def FProp(self, theta: NestedMap, *args: Any) -> Any:
        """Returns the last child's output; `args` are the first child's inputs."""
        return RunChain(self.sub, theta.sub, args)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Any) -> NestedMap:
        _CheckSub(p.sub, p.name or cls.__name__)
        return ChainMeta(p, p.sub, input_shapes)


class RepeatLayer(base_layer.BaseLayer):
    """Runs `repeat` copies of `body` in order; each copy has its own weights."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("body", None, "Params of the layer to repeat; copies are named body_<i>.")
        p.Define("repeat", 1, "Number of copies of body, run one after another (>= 1).")
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        _CheckRepeat(p.body, p.repeat, self.path)
        # Unnamed copies get distinct paths (body_<i>), hence distinct weight seeds.
        body_p = p.body.Copy().Set(name="")
        self.CreateChildren("body", [body_p] * p.repeat)

    def FProp(self, theta: NestedMap, *args: Any) -> Any:
        """Returns the last copy's output; `args` are the first copy's inputs."""
        return RunChain(self.body, theta.body, args)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Any) -> NestedMap:
        where = p.name or cls.__name__
        _CheckRepeat(p.body, p.repeat, where)
        meta = ChainMeta(p, [p.body], input_shapes)
        in_shapes = tuple(base_layer.NormShape(s) for s in input_shapes)
        if p.repeat > 1 and not _ShapesEqual(meta.out_shapes, in_shapes):
            raise ValueError(
                f"{where}: repeat={p.repeat} needs a body whose output shapes equal its "
                f"input shapes, received input shapes {_ShapesText(in_shapes)} and output "
                f"shapes {_ShapesText(meta.out_shapes)}"
            )
        return base_layer.Meta(meta.out_shapes, meta.flops * p.repeat, meta.num_params * p.repeat)


def _ShapesEqual(a: tuple, b: tuple) -> bool:
    try:
        tf.nest.assert_same_structure(a, b)
    except (ValueError, TypeError):
        return False
    pairs = zip(tf.nest.flatten(a), tf.nest.flatten(b))
    return all(
        x.rank == y.rank and (x.rank is None or x.as_list() == y.as_list()) for x, y in pairs
    )


def _ShapesText(shapes: tuple) -> str:
    return str(tf.nest.map_structure(lambda s: s.as_list() if s.rank is not None else None, shapes))

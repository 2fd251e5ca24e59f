"""BaseLayer: Lingvo's layer contract on a tf.Module.

A layer is built from its params, creates its children and variables while it is
constructed (so that a pipeline can see shapes, parameters and FLOPs before the
first call), and computes with `FProp(theta, *inputs)`, where `theta` is a
NestedMap of its variables and its children's thetas:

    class Scale(base_layer.BaseLayer):

      @classmethod
      def Params(cls):
        p = super().Params()
        p.Define('dims', 0, 'Size of the last input dimension.')
        return p

      def __init__(self, params):
        super().__init__(params)
        p = self.params
        self.CreateVariable('w', base_layer.WeightParams([p.dims]))

      def FProp(self, theta, inputs):
        return inputs * theta.w

    layer = Scale.Params().Set(name='scale', dims=4).Instantiate()
    y = layer(x)  # FProp(layer.theta, x)

Variables are named after the layer path (`model/enc/fc/w`) and checkpoints key
them the same way, so `tf.train.Checkpoint` over a layer tree round-trips into a
freshly built tree.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from lingpipe import hyperparams, seeds
from lingpipe.nested_map import NestedMap

__all__ = [
    "BaseLayer",
    "DoEval",
    "EvalMode",
    "Fans",
    "InitialValue",
    "IsLayerParams",
    "IsRecomputing",
    "Meta",
    "NormShape",
    "Recomputation",
    "ToShape",
    "WeightInit",
    "WeightParams",
]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_state = threading.local()


def _PathStack() -> list[str]:
    if not hasattr(_state, "paths"):
        _state.paths = []
    return _state.paths


def _EvalStack() -> list[bool]:
    if not hasattr(_state, "eval"):
        _state.eval = []
    return _state.eval


@contextlib.contextmanager
def EvalMode(do_eval: bool = True) -> Iterator[None]:
    """Layers called inside run in eval mode: no dropout, batch norm uses moving statistics.

    The mode is read when a layer's FProp is traced, so build one `tf.function`
    for training and another for eval, each traced inside its own mode.
    """
    _EvalStack().append(bool(do_eval))
    try:
        yield
    finally:
        _EvalStack().pop()


def DoEval() -> bool:
    """True inside EvalMode()."""
    stack = _EvalStack()
    return stack[-1] if stack else False


@contextlib.contextmanager
def Recomputation(active: bool = True) -> Iterator[None]:
    """Layers called inside replay a forward that already ran (a pipeline's recompute in
    backward): a layer with state updates (batch norm's statistics) must not apply
    them a second time. `active=False` is a no-op, for callers that pass a flag.
    """
    if not hasattr(_state, "recompute"):
        _state.recompute = []
    _state.recompute.append(bool(active))
    try:
        yield
    finally:
        _state.recompute.pop()


def IsRecomputing() -> bool:
    """True inside an active Recomputation()."""
    return any(getattr(_state, "recompute", ()))


class WeightInit:
    """Initializers for CreateVariable, as params: `WeightInit.Gaussian(0.02, seed=1)`.

    `seed` None takes the layer's `random_seed` (0 if unset). Either way the
    variable's path is hashed in, so the same params always give the same weights
    and two variables never share their draws.
    """

    METHODS = (
        "constant",
        "uniform",
        "gaussian",
        "truncated_gaussian",
        "xavier",
        "gaussian_sqrt_dim",
        "uniform_sqrt_dim",
    )

    @staticmethod
    def _Make(method: str, scale: float, seed: int | None) -> hyperparams.Params:
        p = hyperparams.Params()
        p.Define("method", method, f"One of {WeightInit.METHODS}.")
        p.Define("scale", float(scale), "Scale of the distribution (see each method).")
        p.Define("seed", seed, "Random seed; None takes the layer's random_seed.")
        return p

    @staticmethod
    def Constant(scale: float = 0.0) -> hyperparams.Params:
        """Every value is `scale`."""
        return WeightInit._Make("constant", scale, None)

    @staticmethod
    def Uniform(scale: float = 1.0, seed: int | None = None) -> hyperparams.Params:
        """U(-scale, scale)."""
        return WeightInit._Make("uniform", scale, seed)

    @staticmethod
    def Gaussian(scale: float = 1.0, seed: int | None = None) -> hyperparams.Params:
        """N(0, scale^2)."""
        return WeightInit._Make("gaussian", scale, seed)

    @staticmethod
    def TruncatedGaussian(scale: float = 1.0, seed: int | None = None) -> hyperparams.Params:
        """N(0, scale^2) redrawn beyond two standard deviations."""
        return WeightInit._Make("truncated_gaussian", scale, seed)

    @staticmethod
    def Xavier(scale: float = 1.0, seed: int | None = None) -> hyperparams.Params:
        """Glorot uniform: U(-l, l), l = scale * sqrt(6 / (fan_in + fan_out))."""
        return WeightInit._Make("xavier", scale, seed)

    @staticmethod
    def GaussianSqrtDim(scale: float = 1.0, seed: int | None = None) -> hyperparams.Params:
        """N(0, (scale / sqrt(fan_in))^2)."""
        return WeightInit._Make("gaussian_sqrt_dim", scale, seed)

    @staticmethod
    def UniformSqrtDim(scale: float = 1.0, seed: int | None = None) -> hyperparams.Params:
        """U(-l, l), l = scale / sqrt(fan_in)."""
        return WeightInit._Make("uniform_sqrt_dim", scale, seed)


def WeightParams(
    shape: Sequence[int],
    init: hyperparams.Params | None = None,
    dtype: tf.DType | None = None,
    collections: Sequence[str] | None = None,
) -> hyperparams.Params:
    """Describes a variable for CreateVariable: shape, initializer, dtype, collections.

    `init` None takes the layer's `params_init`; `dtype` None takes its `dtype`.
    """
    p = hyperparams.Params()
    p.Define("shape", list(shape), "Shape of the variable.")
    p.Define("init", init, "A WeightInit; None takes the layer's params_init.")
    p.Define("dtype", dtype, "Variable dtype; None takes the layer's dtype.")
    p.Define("collections", list(collections or []), "Names of collections to tag it with.")
    return p


def Fans(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight: [in, out] or [..., receptive field, in, out]."""
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return int(shape[0]), int(shape[0])
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    return int(shape[-2]) * receptive, int(shape[-1]) * receptive


def InitialValue(
    init: hyperparams.Params, shape: Sequence[int], dtype: tf.DType, seed: tuple[int, int]
) -> tf.Tensor:
    """The initial value that `init` gives a variable of `shape`, drawn with `seed`."""
    method, scale = init.method, init.scale
    fan_in, fan_out = Fans(shape)
    shape = list(shape)
    if method == "constant":
        return tf.fill(shape, tf.cast(scale, dtype))
    if method == "uniform":
        limit = scale
    elif method == "xavier":
        limit = scale * math.sqrt(6.0 / (fan_in + fan_out))
    elif method == "uniform_sqrt_dim":
        limit = scale / math.sqrt(fan_in)
    elif method == "gaussian":
        return tf.random.stateless_normal(shape, seed, stddev=scale, dtype=dtype)
    elif method == "gaussian_sqrt_dim":
        std = scale / math.sqrt(fan_in)
        return tf.random.stateless_normal(shape, seed, stddev=std, dtype=dtype)
    elif method == "truncated_gaussian":
        return tf.random.stateless_truncated_normal(shape, seed, stddev=scale, dtype=dtype)
    else:
        raise ValueError(
            f"unknown WeightInit method {method!r}; expected one of {WeightInit.METHODS}"
        )
    return tf.random.stateless_uniform(shape, seed, minval=-limit, maxval=limit, dtype=dtype)


def _InitPhase(init):
    """Wraps a layer class's __init__ so that the outermost one finishes construction.

    When the most derived __init__ returns, `_CreateLayerVariables()` runs and the
    layer stops accepting new children and variables.
    """

    @functools.wraps(init)
    def Wrapped(self, *args, **kwargs):
        depth = self.__dict__.get("_init_depth", 0)
        object.__setattr__(self, "_init_depth", depth + 1)
        try:
            init(self, *args, **kwargs)
        finally:
            object.__setattr__(self, "_init_depth", depth)
        if depth == 0:
            self._FinishConstruction()

    return Wrapped


class BaseLayer(tf.Module):
    """The base of every lingpipe layer (see the module docstring)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _InitPhase(cls.__dict__["__init__"])

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        """The params of this layer class, with their defaults."""
        p = hyperparams.InstantiableParams(cls)
        p.Define("name", "", "Name of this layer: a Python identifier, unique among siblings.")
        p.Define("dtype", tf.float32, "Dtype of the variables.")
        p.Define("fprop_dtype", None, "Dtype of the activations; None means `dtype`.")
        p.Define("params_init", WeightInit.Xavier(1.0), "Default initializer of the weights.")
        p.Define(
            "random_seed",
            None,
            "Seed of weight initialization and dropout; None inherits the parent's (or 0).",
        )
        p.Define(
            "skip_lp_regularization",
            None,
            "If True, L1/L2 weight decay skips this layer's variables; None inherits.",
        )
        return p

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        hyperparams.CheckInstantiable(params, self)
        if not params.name:
            raise ValueError(
                f"{type(self).__name__}: params.name is not set; every layer needs a name "
                f"(p.name = 'fc'), it makes the variable and checkpoint paths"
            )
        if not isinstance(params.name, str) or not _NAME_RE.match(params.name):
            raise ValueError(
                f"{type(self).__name__}: expected params.name to be a Python identifier, "
                f"received name={params.name!r}"
            )
        super().__init__(name=params.name)
        parent_path = _PathStack()[-1] if _PathStack() else ""
        object.__setattr__(self, "_init_done", False)
        # object.__setattr__: plain Python state that tf.Module must not track.
        object.__setattr__(self, "_params", params.Copy().Freeze())
        object.__setattr__(
            self, "_path", f"{parent_path}/{params.name}" if parent_path else params.name
        )
        object.__setattr__(self, "_private_vars", NestedMap())
        object.__setattr__(self, "_private_children", NestedMap())
        object.__setattr__(self, "_var_collections", {})

    __init__ = _InitPhase(__init__)

    # ---- Construction -------------------------------------------------------

    def _CreateLayerVariables(self) -> None:
        """Hook: creates this layer's variables after its __init__ (optional)."""

    def _FinishConstruction(self) -> None:
        self._CreateLayerVariables()
        object.__setattr__(self, "_init_done", True)

    def _CheckConstructing(self, what: str) -> None:
        if self.__dict__.get("_init_done", True):
            raise ValueError(
                f"{self.path}: {what} must be called inside __init__ or "
                f"_CreateLayerVariables, while the layer is built (shapes, parameters "
                f"and devices are fixed then)"
            )

    @classmethod
    def CopyBaseParams(
        cls, from_params: hyperparams.Params, to_params: hyperparams.Params
    ) -> hyperparams.Params:
        """Lets a child inherit the parent's base params that it left at their defaults."""
        if to_params.dtype == tf.float32:
            to_params.dtype = from_params.dtype
        if to_params.fprop_dtype is None:
            to_params.fprop_dtype = from_params.fprop_dtype
        if to_params.random_seed is None:
            to_params.random_seed = from_params.random_seed
        if to_params.skip_lp_regularization is None:
            to_params.skip_lp_regularization = from_params.skip_lp_regularization
        if to_params.params_init == WeightInit.Xavier(1.0):
            to_params.params_init = from_params.params_init.Copy()
        return to_params

    def _CheckChildName(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(
                f"{self.path}: expected a child name that is a Python identifier, received {name!r}"
            )
        if name in self._private_children or name in self._private_vars:
            raise ValueError(f"{self.path}: a child or variable named {name!r} already exists")

    def _BuildChild(self, default_name: str, params: hyperparams.Params) -> BaseLayer:
        if not IsLayerParams(params):
            raise TypeError(
                f"{self.path}: expected the params of a BaseLayer subclass for child "
                f"{default_name!r}, received {type(params).__name__}"
                + (
                    f" for {params.cls!r}"
                    if isinstance(params, hyperparams.InstantiableParams)
                    else ""
                )
            )
        p = self.CopyBaseParams(self.params, params.Copy())
        if not p.name:
            p.name = default_name
        _PathStack().append(self.path)
        try:
            return p.Instantiate()
        finally:
            _PathStack().pop()

    def CreateChild(self, name: str, params: hyperparams.InstantiableParams) -> BaseLayer:
        """Builds a child layer from `params` and makes `self.<name>` and `theta.<name>`.

        The child's params.name defaults to `name`; its path is `<self.path>/<its name>`.
        """
        self._CheckConstructing(f"CreateChild({name!r})")
        self._CheckChildName(name)
        child = self._BuildChild(name, params)
        self._private_children[name] = child
        self._track_trackable(child, name=name)
        return child

    def CreateChildren(
        self, name: str, params_list: Sequence[hyperparams.InstantiableParams]
    ) -> list[BaseLayer]:
        """Builds a list of children; unnamed ones are called `<name>_<i>`."""
        self._CheckConstructing(f"CreateChildren({name!r})")
        self._CheckChildName(name)
        if isinstance(params_list, hyperparams.Params) or not isinstance(
            params_list, (list, tuple)
        ):
            raise TypeError(
                f"{self.path}: CreateChildren({name!r}) expects a list of layer params, "
                f"received {type(params_list).__name__}"
            )
        children = []
        for i, params in enumerate(params_list):
            child = self._BuildChild(f"{name}_{i}", params)
            self._track_trackable(child, name=f"{name}_{i}")
            children.append(child)
        self._private_children[name] = children
        return children

    def CreateVariable(
        self, name: str, var_params: hyperparams.Params, trainable: bool = True
    ) -> tf.Variable:
        """Creates variable `name` of this layer as `var_params` (a WeightParams) says.

        The variable is placed on the device scope active while the layer is built,
        named `<self.path>/<name>`, and appears as `self.vars.<name>`, `self.theta.<name>`.
        """
        self._CheckConstructing(f"CreateVariable({name!r})")
        self._CheckChildName(name)
        p = self.params
        shape = list(var_params.shape)
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
            raise ValueError(
                f"{self.path}: variable {name!r} needs a shape of non-negative integers, "
                f"received shape={shape}"
            )
        init = var_params.init or p.params_init
        dtype = var_params.dtype or p.dtype
        base = seeds.BaseSeed(f"{self.path}/{name}", p.random_seed)
        seed = base if init.seed is None else (int(init.seed) & 0x7FFFFFFF, base[1])
        with tf.init_scope():
            value = InitialValue(init, shape, dtype, seed)
            var = tf.Variable(value, name=f"{self.path}/{name}", trainable=trainable)
        self._private_vars[name] = var
        self._var_collections[name] = list(var_params.collections)
        self._track_trackable(var, name=name)
        return var

    # ---- Introspection ------------------------------------------------------

    @property
    def params(self) -> hyperparams.InstantiableParams:
        """This layer's params (frozen: Copy() them to make another layer)."""
        return self._params

    @property
    def path(self) -> str:
        """Slash-separated names from the root layer to this one, e.g. 'model/enc/fc'."""
        return self._path

    @property
    def fprop_dtype(self) -> tf.DType:
        return self.params.fprop_dtype or self.params.dtype

    @property
    def do_eval(self) -> bool:
        return DoEval()

    @property
    def children(self) -> NestedMap:
        return self._private_children

    def Descendants(self) -> Iterator[BaseLayer]:
        """The layers below this one: each child, then its descendants, in creation order."""
        for child in self._private_children.values():
            for c in child if isinstance(child, list) else [child]:
                yield c
                yield from c.Descendants()

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: children are attributes too.
        children = self.__dict__.get("_private_children")
        if children is not None and name in children:
            return children[name]
        raise AttributeError(
            f"{type(self).__name__} {self.__dict__.get('_path', '?')!r} has no attribute "
            f"{name!r}" + (f"; its children are {sorted(children)}" if children else "")
        )

    def _Tree(self, own: NestedMap, child_fn) -> NestedMap:
        out = NestedMap(own)
        for name, child in self._private_children.items():
            out[name] = [child_fn(c) for c in child] if isinstance(child, list) else child_fn(child)
        return out

    @property
    def vars(self) -> NestedMap:
        """NestedMap of this layer's variables and, under each child's name, its vars."""
        return self._Tree(self._private_vars, lambda c: c.vars)

    @property
    def theta(self) -> NestedMap:
        """What FProp computes with: the variables, in the shape of `vars`.

        Pass another NestedMap of the same structure (tensors) to FProp to compute
        with other values, e.g. a weight shared with another layer.
        """
        return self.vars

    def VarCollections(self) -> dict[str, list[str]]:
        """Collections of every variable in the tree, keyed by variable name."""
        out = {self._private_vars[k].name: v for k, v in self._var_collections.items()}
        for child in self._private_children.values():
            for c in child if isinstance(child, list) else [child]:
                out.update(c.VarCollections())
        return out

    # ---- Computation --------------------------------------------------------

    def FProp(self, theta: NestedMap, *args: Any, **kwargs: Any) -> Any:
        """Forward computation with `theta` (the layer's variables or a substitute)."""
        raise TypeError(f"{type(self).__name__} must define FProp(self, theta, *inputs)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs FProp with this layer's own theta."""
        return self.FProp(self.theta, *args, **kwargs)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, *input_shapes: Any) -> NestedMap:
        """Output shapes, FLOPs and parameter count of FProp, from params alone.

        Returns NestedMap(out_shapes=tuple of tf.TensorShape (or NestedMaps of them),
        flops=int, num_params=int). Builds nothing.
        """
        raise TypeError(f"{cls.__name__} must define FPropMeta(cls, p, *input_shapes)")


def IsLayerParams(params: Any) -> bool:
    """Whether `params` are the InstantiableParams of a BaseLayer subclass."""
    return isinstance(params, hyperparams.InstantiableParams) and (
        isinstance(params.cls, type) and issubclass(params.cls, BaseLayer)
    )


def Meta(out_shapes: Any, flops: int, num_params: int) -> NestedMap:
    """The result of FPropMeta; `out_shapes` is a shape or a tuple of them."""
    if not isinstance(out_shapes, tuple):
        out_shapes = (out_shapes,)
    return NestedMap(out_shapes=out_shapes, flops=int(flops), num_params=int(num_params))


def ToShape(shape: Any) -> tf.TensorShape:
    """tf.TensorShape of a shape-like (list, tuple, TensorShape) for FPropMeta."""
    return shape if isinstance(shape, tf.TensorShape) else tf.TensorShape(shape)


def NormShape(shape: Any) -> Any:
    """A shape-like as tf.TensorShape; NestedMaps (and dicts) of shapes keep their structure."""
    if isinstance(shape, dict):
        return NestedMap({k: NormShape(v) for k, v in shape.items()})
    return ToShape(shape)

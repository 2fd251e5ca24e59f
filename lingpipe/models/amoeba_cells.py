"""AmoebaNet cells of the GPipe image classifier (`image.AmoebaNetClassifier`).

Each cell maps the NestedMap state to the next one: `StemCell` (images -> x = prev),
`AmoebaCell` (a normal or reduction cell) and `HeadCell` (-> xent, correct, logits);
`AmoebaOp` is one operation of a cell. The cell order is described in `image`.

Every AmoebaNet cell takes the two previous hidden states (state.x, state.prev).
It first brings both to x's spatial size and the cell's `filters` (ReLU-1x1 conv-BN,
strided for a prev twice as large, skipped where nothing differs), then runs the
genotype: five pairs of operations, each pair summed into a new hidden state, the
operations on the two inputs strided in a reduction cell. The hidden states that the
genotype marks unused are concatenated and a ReLU-1x1 conv-BN projects them to `filters`.
Genotypes: AmoebaNet-A and -B as tensorflow/tpu amoeba_net/model_specs.py gives them;
operations: 'none' (identity), '{avg,max}_pool_kxk', '[dil_d_]separable_kxk_n' (n
times ReLU-separable conv-BN), 'kxk' conv, '1x7_7x1'; each is followed by a
BatchNormLayer except an identity.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from lingpipe import asserts, base_layer, hyperparams
from lingpipe.layers import conv, linear, normalization, pooling, softmax
from lingpipe.nested_map import NestedMap

__all__ = [
    "AmoebaCell",
    "AmoebaOp",
    "GENOTYPES",
    "HeadCell",
    "OpSteps",
    "StemCell",
]

# Per genotype, per cell type: (operations, hidden-state index of each operation's input,
# used[i] = 1 where hidden state i is left out of the output's concatenation).
GENOTYPES = {
    "amoeba_net_a": {
        "normal": (
            ("avg_pool_3x3", "max_pool_3x3", "separable_3x3_2", "none", "none")
            + ("avg_pool_3x3", "separable_3x3_2", "separable_5x5_2", "avg_pool_3x3")
            + ("separable_3x3_2",),
            (0, 0, 1, 1, 0, 1, 0, 2, 5, 0),
            (1, 0, 1, 0, 0, 1, 0),
        ),
        "reduction": (
            ("separable_3x3_2", "avg_pool_3x3", "max_pool_3x3", "separable_7x7_2")
            + ("max_pool_3x3", "max_pool_3x3", "separable_3x3_2", "1x7_7x1", "avg_pool_3x3")
            + ("separable_7x7_2",),
            (1, 0, 0, 2, 1, 0, 4, 0, 1, 0),
            (1, 1, 0, 0, 0, 0, 0),
        ),
    },
    "amoeba_net_b": {
        "normal": (
            ("1x1", "max_pool_3x3", "none", "separable_3x3_2", "1x1", "separable_3x3_2")
            + ("1x1", "none", "avg_pool_3x3", "1x1"),
            (1, 1, 1, 0, 1, 0, 2, 2, 1, 5),
            (0, 1, 1, 0, 0, 1, 0),
        ),
        "reduction": (
            ("max_pool_2x2", "max_pool_3x3", "none", "3x3", "dil_2_separable_5x5_2")
            + ("max_pool_3x3", "none", "separable_3x3_2", "avg_pool_3x3", "1x1"),
            (0, 0, 2, 1, 2, 2, 3, 1, 4, 3),
            (1, 1, 1, 1, 1, 0, 0),
        ),
    },
}

_POOL = re.compile(r"^(avg|max)_pool_(\d+)x\2$")
_SEPARABLE = re.compile(r"^(?:dil_(\d+)_)?separable_(\d+)x\2_(\d+)$")
_CONV = re.compile(r"^(\d+)x\1$")
_FACTORIZED = re.compile(r"^1x(\d+)_\1x1$")


def _Conv(name: str, window: tuple, cin: int, cout: int, stride: tuple) -> hyperparams.Params:
    return conv.Conv2DLayer.Params().Set(
        name=name, filter_shape=(*window, cin, cout), filter_stride=stride, has_bias=False
    )


def OpSteps(
    op: str, cin: int, filters: int, stride: int, bn: hyperparams.Params, where: str
) -> list[tuple[bool, hyperparams.Params]]:
    """The layers of operation `op`, in order: (ReLU before it?, its params)."""
    s, steps = (stride, stride), []

    def Bn(i: int = 0) -> tuple[bool, hyperparams.Params]:
        return False, bn.Copy().Set(name=f"bn_{i}", dim=filters)

    if op == "none":
        if stride > 1 or cin != filters:  # NASNet's strided (or widening) identity
            steps = [(True, _Conv("conv", (1, 1), cin, filters, s)), Bn()]
    elif m := _POOL.match(op):
        if cin != filters:
            raise ValueError(f"{where}: pooling cannot change channels {cin} -> {filters}")
        k = int(m.group(2))
        pool = pooling.Pooling2DLayer.Params().Set(
            name="pool", window_shape=(k, k), window_stride=s, pooling_type=m.group(1).upper()
        )
        steps = [(False, pool), Bn()]
    elif m := _SEPARABLE.match(op):
        dilation, k, repeats = int(m.group(1) or 1), int(m.group(2)), int(m.group(3))
        for i in range(repeats):
            sep = conv.SeparableConv2DLayer.Params().Set(
                name=f"sep_{i}",
                filter_shape=(k, k, cin if i == 0 else filters, filters),
                filter_stride=s if i == 0 else (1, 1),
                dilation_rate=(dilation, dilation),
                has_bias=False,
            )
            steps += [(True, sep), Bn(i)]
    elif m := _CONV.match(op):
        k = int(m.group(1))
        steps = [(True, _Conv("conv", (k, k), cin, filters, s)), Bn()]
    elif m := _FACTORIZED.match(op):
        k = int(m.group(1))
        steps = [
            (True, _Conv("conv_1xk", (1, k), cin, filters, (1, stride))),
            (False, _Conv("conv_kx1", (k, 1), filters, filters, (stride, 1))),
            Bn(),
        ]
    else:
        raise ValueError(
            f"{where}: unknown AmoebaNet operation {op!r}; expected 'none', "
            f"'avg_pool_KxK', 'max_pool_KxK', '[dil_D_]separable_KxK_N', 'KxK' or '1xK_Kx1'"
        )
    return steps


class AmoebaOp(base_layer.BaseLayer):
    """One operation of a cell: [b, h, w, in_channels] -> [b, h / stride, w / stride, filters]."""

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("op", "none", "Operation name, e.g. 'separable_3x3_2' (see the module doc).")
        p.Define("in_channels", 0, "Channels of the input.")
        p.Define("filters", 0, "Channels of the output.")
        p.Define("stride", 1, "Spatial stride: 1, or 2 in reduction cells.")
        p.Define("bn_tpl", normalization.BatchNormLayer.Params(), "Batch norm template.")
        return p

    @classmethod
    def _Steps(cls, p: hyperparams.Params, where: str) -> list:
        asserts.Positive(p.in_channels, "in_channels", where=where)
        asserts.Positive(p.filters, "filters", where=where)
        asserts.In(p.stride, (1, 2), "stride", where=where)
        return OpSteps(p.op, p.in_channels, p.filters, p.stride, p.bn_tpl, where)

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        steps = self._Steps(self.params, self.path)
        object.__setattr__(self, "_relu", [relu for relu, _ in steps])
        self.CreateChildren("step", [sp for _, sp in steps])

    def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
        """inputs: [b, h, w, in_channels] -> [b, h', w', filters] (identity: unchanged)."""
        x = inputs
        for relu, layer, th in zip(self._relu, self.step, theta.step):
            x = layer.FProp(th, tf.nn.relu(x) if relu else x)
        return x

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, inputs_shape: Any) -> NestedMap:
        shape, flops, num_params = base_layer.ToShape(inputs_shape), 0, 0
        for relu, sp in cls._Steps(p, p.name or cls.__name__):
            meta = sp.cls.FPropMeta(sp, shape)
            flops += meta.flops + (shape.num_elements() if relu else 0)
            num_params += meta.num_params
            shape = meta.out_shapes[0]
        return base_layer.Meta(shape, flops, num_params)


def _OpParams(p: hyperparams.Params, op: str, cin: int, stride: int) -> hyperparams.Params:
    return AmoebaOp.Params().Set(
        op=op, in_channels=cin, filters=p.filters, stride=stride, bn_tpl=p.bn_tpl.Copy()
    )


class AmoebaCell(base_layer.BaseLayer):
    """A normal (stride 1) or reduction (stride 2) cell on NestedMap(x, prev, ...).

    state.x: [b, h, w, x_channels]; state.prev: [b, h * prev_stride, w * prev_stride,
    prev_channels]. Returns the state with prev = x and x = the cell's output
    [b, h / stride, w / stride, filters]; other leaves pass through.
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("genotype", "amoeba_net_a", f"One of {sorted(GENOTYPES)}.")
        p.Define("reduction", False, "True: a reduction cell (stride 2).")
        p.Define("filters", 0, "Channels of the cell's operations and of its output.")
        p.Define("x_channels", 0, "Channels of state.x.")
        p.Define("prev_channels", 0, "Channels of state.prev.")
        p.Define("prev_stride", 1, "state.prev's spatial size over state.x's: 1 or 2.")
        p.Define("bn_tpl", normalization.BatchNormLayer.Params(), "Batch norm template.")
        return p

    @classmethod
    def _Children(cls, p: hyperparams.Params, where: str) -> tuple:
        """(x_adjust, prev_adjust, ops, proj) params, and the concatenated state indices."""
        asserts.In(p.genotype, sorted(GENOTYPES), "genotype", where=where)
        asserts.Positive(p.filters, "filters", where=where)
        asserts.In(p.prev_stride, (1, 2), "prev_stride", where=where)
        ops, indices, used = GENOTYPES[p.genotype]["reduction" if p.reduction else "normal"]
        if p.reduction and not (used[0] and used[1]):
            raise ValueError(
                f"{where}: genotype {p.genotype!r}: a reduction cell must consume both of its "
                f"inputs (their size differs from its output's), received used={used}"
            )
        stride = 2 if p.reduction else 1
        x_adjust = _OpParams(p, "none", p.x_channels, 1)
        prev_adjust = _OpParams(p, "none", p.prev_channels, p.prev_stride)
        ops = [_OpParams(p, op, p.filters, stride if i < 2 else 1) for op, i in zip(ops, indices)]
        concat = [i for i, u in enumerate(used) if not u]
        proj = _OpParams(p, "1x1", len(concat) * p.filters, 1)
        return x_adjust, prev_adjust, ops, proj, concat

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        x_adjust, prev_adjust, ops, proj, concat = self._Children(self.params, self.path)
        object.__setattr__(self, "_concat", concat)
        self.CreateChild("x_adjust", x_adjust)
        self.CreateChild("prev_adjust", prev_adjust)
        self.CreateChildren("op", ops)
        self.CreateChild("proj", proj)

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        """state.x, state.prev -> the state with prev = x, x = [b, h', w', filters]."""
        p = self.params
        hidden = [
            self.x_adjust.FProp(theta.x_adjust, state.x),
            self.prev_adjust.FProp(theta.prev_adjust, state.prev),
        ]
        if hidden[0].shape[1:3] != hidden[1].shape[1:3]:
            raise ValueError(
                f"{self.path}: x and prev disagree in spatial size after adjustment "
                f"(prev_stride={p.prev_stride}), received x.shape={state.x.shape.as_list()}, "
                f"prev.shape={state.prev.shape.as_list()}"
            )
        indices = GENOTYPES[p.genotype]["reduction" if p.reduction else "normal"][1]
        for pair in range(len(indices) // 2):
            a, b = 2 * pair, 2 * pair + 1
            left = self.op[a].FProp(theta.op[a], hidden[indices[a]])
            hidden.append(left + self.op[b].FProp(theta.op[b], hidden[indices[b]]))
        out = state.Copy()
        out.prev = state.x
        concat = tf.concat([hidden[i] for i in self._concat], axis=-1)
        out.x = self.proj.FProp(theta.proj, concat)
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        x_adjust, prev_adjust, ops, proj, concat = cls._Children(p, p.name or cls.__name__)
        metas = [AmoebaOp.FPropMeta(x_adjust, state.x), AmoebaOp.FPropMeta(prev_adjust, state.prev)]
        hidden = [m.out_shapes[0] for m in metas]
        indices = GENOTYPES[p.genotype]["reduction" if p.reduction else "normal"][1]
        flops = 0
        for i, op_p in enumerate(ops):
            metas.append(AmoebaOp.FPropMeta(op_p, hidden[indices[i]]))
            if i % 2:
                hidden.append(metas[-1].out_shapes[0])
                flops += hidden[-1].num_elements()  # the pair's sum
        metas.append(AmoebaOp.FPropMeta(proj, hidden[-1][:-1].concatenate([proj.in_channels])))
        out = state.Copy()
        out.prev, out.x = base_layer.ToShape(state.x), metas[-1].out_shapes[0]
        flops += sum(m.flops for m in metas)
        return base_layer.Meta(out, flops, sum(m.num_params for m in metas))


class StemCell(base_layer.BaseLayer):
    """NestedMap(images [b, h, w, channels], labels, ...) -> NestedMap(x, prev, labels, ...).

    x = prev = BN(conv3x3(images)) [b, h / stride, w / stride, filters].
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("channels", 3, "Channels of the images.")
        p.Define("filters", 0, "Channels of the stem's output.")
        p.Define("stride", 1, "Stride of the stem convolution.")
        p.Define("bn_tpl", normalization.BatchNormLayer.Params(), "Batch norm template.")
        return p

    @classmethod
    def _Steps(cls, p: hyperparams.Params) -> list[hyperparams.Params]:
        s = (p.stride, p.stride)
        return [
            _Conv("conv", (3, 3), p.channels, p.filters, s),
            p.bn_tpl.Copy().Set(name="bn", dim=p.filters),
        ]

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        conv_p, bn_p = self._Steps(self.params)
        self.CreateChild("conv", conv_p)
        self.CreateChild("bn", bn_p)

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        x = self.bn.FProp(theta.bn, self.conv.FProp(theta.conv, state.images))
        out = NestedMap({k: v for k, v in state.items() if k != "images"})
        out.x, out.prev = x, x
        return out

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        conv_p, bn_p = cls._Steps(p)
        first = conv.Conv2DLayer.FPropMeta(conv_p, state.images)
        second = normalization.BatchNormLayer.FPropMeta(bn_p, first.out_shapes[0])
        out = NestedMap({k: v for k, v in state.items() if k != "images"})
        out.x = out.prev = second.out_shapes[0]
        return base_layer.Meta(
            out, first.flops + second.flops, first.num_params + second.num_params
        )


class HeadCell(base_layer.BaseLayer):
    """ReLU, global average pooling, fully connected, softmax cross-entropy.

    state.x [b, h, w, input_dims], state.labels int [b] -> NestedMap(xent [b] (with label
    smoothing), correct [b] (1.0 where argmax == label), logits [b, num_classes]).
    """

    @classmethod
    def Params(cls) -> hyperparams.InstantiableParams:
        p = super().Params()
        p.Define("input_dims", 0, "Channels of state.x.")
        p.Define("num_classes", 0, "Number of classes.")
        p.Define("label_smoothing", 0.0, "Label smoothing of the cross-entropy.")
        return p

    @classmethod
    def _Fc(cls, p: hyperparams.Params) -> hyperparams.Params:
        return linear.ProjectionLayer.Params().Set(
            name="fc", input_dims=p.input_dims, output_dims=p.num_classes, activation="NONE"
        )

    def __init__(self, params: hyperparams.InstantiableParams) -> None:
        super().__init__(params)
        softmax.CheckLabelSmoothing(self.params.label_smoothing, self.path)
        self.CreateChild("fc", self._Fc(self.params))

    def FProp(self, theta: NestedMap, state: NestedMap) -> NestedMap:
        p = self.params
        pooled = tf.reduce_mean(tf.nn.relu(state.x), axis=[1, 2])
        logits = self.fc.FProp(theta.fc, pooled)
        out = softmax.CrossEntropy(
            logits, class_ids=state.labels, label_smoothing=p.label_smoothing, where=self.path
        )
        correct = tf.cast(tf.equal(out.per_example_argmax, state.labels), logits.dtype)
        return NestedMap(xent=out.per_example_xent, correct=correct, logits=logits)

    @classmethod
    def FPropMeta(cls, p: hyperparams.Params, state: NestedMap) -> NestedMap:
        x = base_layer.ToShape(state.x)
        fc = linear.ProjectionLayer.FPropMeta(cls._Fc(p), [x[0], p.input_dims])
        batch = base_layer.ToShape(state.labels)
        out = NestedMap(xent=batch, correct=batch, logits=fc.out_shapes[0])
        flops = 2 * x.num_elements() + fc.flops + 5 * fc.out_shapes[0].num_elements()
        return base_layer.Meta(out, flops, fc.num_params)

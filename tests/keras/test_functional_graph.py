"""lingpipe.keras.Pipeline on a nested Functional model: cut at layer names, the partition
report's crossing tensors, equality with the plain model, errors in one line."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import lingpipe.keras as lpk

DEVICES = ["/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]


def _Classifier():
    """x [batch, 8] -> backbone (dense1, dense2, + dense1: a skip) -> head -> logits [batch, 3]."""
    feat = keras.Input((8,), name="feat")
    h = keras.layers.Dense(16, activation="relu", name="b_dense1")(feat)
    h2 = keras.layers.Dense(16, activation="tanh", name="b_dense2")(h)
    backbone = keras.Model(feat, keras.layers.Add(name="b_add")([h, h2]), name="backbone")
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(8, activation="relu", name="head")(backbone(x))
    return keras.Model(x, keras.layers.Dense(3, name="logits")(h), name="classifier")


def _PlainCopy(model):
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def _Data():
    rng = np.random.RandomState(0)
    return rng.randn(16, 8).astype(np.float32), rng.randint(0, 3, 16)


def test_nested_backbone_cut_at_layer_names_equals_plain_model():
    keras.utils.set_random_seed(3)
    model = _Classifier()
    plain = _PlainCopy(model)
    pipe = lpk.Pipeline(
        model,
        num_stages=3,
        num_micro_batches=2,
        split_points=["b_dense2", "head"],
        devices=DEVICES,
    )
    stages = pipe.pipeline.cut.stages
    names = [[pipe.pipeline.cut.graph.nodes[i].name for i in idx] for idx in stages]
    assert names == [
        ["backbone/b_dense1"],
        ["backbone/b_dense2", "backbone/b_add"],
        ["head", "logits"],
    ]
    layers = {x.name: x for x in model.get_layer("backbone").layers + model.layers}
    assert layers["b_dense1"].kernel.value.device.endswith("CPU:1")
    assert layers["b_add"] is not None and layers["b_dense2"].kernel.value.device.endswith("CPU:2")
    assert layers["logits"].kernel.value.device.endswith("CPU:3")
    x, y = _Data()
    np.testing.assert_allclose(pipe.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6)
    for m in (pipe, plain):
        m.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.weights, plain.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5, err_msg=a.path)


def test_partition_report_lists_crossing_tensors_and_bytes():
    model = _Classifier()
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=2, split_points=["b_dense2"], devices=DEVICES[:2]
    )
    text = str(pipe.pipeline.PartitionReport(batch_size=4))
    # b_dense1's output is read by b_dense2 and, through the skip, by b_add: it crosses once.
    assert (
        "stage 0 -> stage 1: 1 tensor(s), 256 bytes: backbone/b_dense1 [batch, 16] float32" in text
    )
    rows = [line.split() for line in text.splitlines()[1:3]]
    # stage, device, the layer calls (first..last and how many), params (as the
    # one report of both front ends prints them: the engine's PartitionReport table).
    assert rows[0][:5] == ["0", "/device:CPU:1", "backbone/b_dense1", "(1)", "144"]
    assert rows[1][:4] == ["1", "/device:CPU:2", "backbone/b_dense2..logits", "(4)"]
    assert text.splitlines()[0].split()[2:4] == ["layer", "calls"]
    assert "FLOPs and bytes for batch 4" in text and "micro_batches=2" in text
    report = pipe.pipeline.PartitionReport()
    assert [s.boundary_bytes for s in report.stages] == [64, 0]


def test_two_crossing_tensors_at_a_cut_inside_the_skip():
    """A cut between b_dense2 and b_add sends both branches: the skip and the activation."""
    model = _Classifier()
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=2, split_points=["b_add"], devices=DEVICES[:2]
    )
    crossing = pipe.pipeline.PartitionReport().stages[0].crossing
    assert [name for name, _, _ in crossing] == ["backbone/b_dense1", "backbone/b_dense2"]


def test_sequential_with_and_without_input_is_pipelined():
    keras.utils.set_random_seed(4)
    x, _ = _Data()
    for seq in (
        keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)]),
        keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)]),
    ):
        if not seq.built:
            seq.build((None, 8))
        plain = _PlainCopy(seq)
        pipe = lpk.Pipeline(seq, num_stages=2, num_micro_batches=2, devices=DEVICES[:2])
        np.testing.assert_allclose(
            pipe.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6
        )


def test_unknown_split_point_is_one_line():
    with pytest.raises(
        ValueError, match=r"unknown split point 'no_such_layer'; expected the name"
    ) as e:
        lpk.Pipeline(
            _Classifier(), num_stages=2, split_points=["no_such_layer"], devices=DEVICES[:2]
        )
    assert "\n" not in str(e.value)


def test_more_stages_than_layer_calls_is_one_line():
    with pytest.raises(
        ValueError,
        match=r"num_stages=6 is more than the model.s 5 layer call\(s\); expected num_stages <= 5",  # noqa: E501
    ) as e:
        lpk.Pipeline(_Classifier(), num_stages=6, devices=[f"/device:CPU:{i}" for i in range(6)])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("front", ["Pipeline", "PipelinedSequential"])
@pytest.mark.parametrize("num_stages", [-1, 2.5, "2"])
def test_num_stages_that_is_not_a_positive_integer_is_one_line(front, num_stages):
    # -1 built a pipeline; 2.5 failed deep inside with "slice indices must be integers".
    layers = [keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(2)]
    make = {"Pipeline": lambda: lpk.Pipeline(keras.Sequential(layers), num_stages=num_stages),
            "PipelinedSequential": lambda: lpk.PipelinedSequential(
                layers[1:], input_shape=(8,), num_stages=num_stages)}[front]  # fmt: skip
    expected = f"expected num_stages to be a positive integer, received num_stages={num_stages!r}"
    with pytest.raises(ValueError, match=re.escape(expected)) as e:
        make()
    assert "\n" not in str(e.value)


def test_a_partition_of_another_number_of_layer_calls_is_one_line():
    with pytest.raises(ValueError, match=r"\[1, 1\] adds up to 2 layer calls, but the model has 5"):
        lpk.Pipeline(_Classifier(), num_stages=2, partition=[1, 1], devices=DEVICES[:2])


def test_split_points_count_must_match_stages():
    with pytest.raises(
        ValueError, match=r"expected num_stages - 1 = 2 split point\(s\).*received 1"
    ):
        lpk.Pipeline(_Classifier(), num_stages=3, split_points=["head"], devices=DEVICES)


def test_unbuilt_sequential_and_subclassed_model_are_refused():
    with pytest.raises(ValueError, match=r"received keras.Sequential .* that is not built"):
        lpk.Pipeline(keras.Sequential([keras.layers.Dense(2)]), num_stages=1)

    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(
        TypeError, match=r"expected a built Keras 3 Functional model .* received Sub"
    ):
        lpk.Pipeline(Sub(), num_stages=1)


def test_devices_given_as_a_number_or_one_name_is_one_line():
    # Plan(model, devices=2) takes a number of devices; a Pipeline's devices are its
    # stages' names. A number was a TypeError; one name was read as its characters.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"^lingpipe.keras.Pipeline: expected devices to be a "
                       r"list .* received devices=2 \(.*num_stages=2\)$"):  # fmt: skip
        lpk.Pipeline(model, devices=2)
    with pytest.raises(ValueError, match=r"^PipelinedSequential: .* received devices='CPU:1'$"):
        lpk.PipelinedSequential([keras.layers.Dense(2)], num_stages=2, devices="CPU:1")


def test_shared_nested_model_and_shared_layer_called_twice():
    """A siamese net: one backbone called on two inputs, one Dense applied to both halves."""
    keras.utils.set_random_seed(6)
    feat = keras.Input((8,))
    backbone = keras.Model(feat, keras.layers.Dense(6, activation="tanh", name="enc")(feat))
    a, b = keras.Input((8,), name="a"), keras.Input((8,), name="b")
    shared = keras.layers.Dense(4, name="shared")
    ha, hb = shared(backbone(a)), shared(backbone(b))
    out = keras.layers.Dense(1, name="out")(keras.layers.Concatenate(name="cat")([ha, hb]))
    model = keras.Model([a, b], out)
    plain = _PlainCopy(model)
    pipe = lpk.Pipeline(model, num_stages=3, num_micro_batches=2, devices=DEVICES)
    names = pipe.pipeline.cut.graph.LayerNames()
    assert sorted(names) == sorted(
        [f"{backbone.name}/enc", f"{backbone.name}@1/enc", "shared", "shared", "cat", "out"]
    )
    rng = np.random.RandomState(1)
    xa, xb = rng.randn(8, 8).astype(np.float32), rng.randn(8, 8).astype(np.float32)
    y = rng.randn(8, 1).astype(np.float32)
    np.testing.assert_allclose(
        pipe.predict([xa, xb], verbose=0), plain.predict([xa, xb], verbose=0), atol=1e-6
    )
    for m in (pipe, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        m.fit([xa, xb], y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for w, v in zip(model.weights, plain.weights):
        np.testing.assert_allclose(w.numpy(), v.numpy(), atol=1e-5, err_msg=w.path)


def test_profile_and_explicit_partitions():
    """'profile' times each layer call (one example, forward and backward): a cut of 2
    non-empty stages."""
    model = _Classifier()
    plain = _PlainCopy(model)
    pipe = lpk.Pipeline(
        model, num_stages=2, num_micro_batches=2, partition="profile", devices=DEVICES[:2]
    )
    cut = pipe.pipeline.cut
    assert cut.policy == "profile" and len(cut.costs) == 5 and min(cut.costs) > 0
    assert [len(s) for s in cut.stages] in ([1, 4], [2, 3], [3, 2], [4, 1])
    x, _ = _Data()
    np.testing.assert_allclose(pipe.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6)
    explicit = lpk.Pipeline(_Classifier(), num_stages=2, partition=[2, 3], devices=DEVICES[:2])
    assert [len(s) for s in explicit.pipeline.cut.stages] == [2, 3]
    with pytest.raises(ValueError, match=r"unknown partition='fast'; expected one of"):
        lpk.Pipeline(_Classifier(), num_stages=2, partition="fast", devices=DEVICES[:2])


def test_tpu_logical_cores_annotate_each_stage_of_a_keras_graph():
    """Under placement.LogicalCores (what TPUStrategy's logical cores use), every
    annotation for core k is made in stage k's device scope, forward and backward."""
    import tensorflow as tf

    from lingpipe.pipeline.step import placement

    keras.utils.set_random_seed(3)
    pipe = lpk.Pipeline(
        _Classifier(),
        num_stages=3,
        num_micro_batches=2,
        split_points=["b_dense2", "head"],
        devices=DEVICES,
    )
    cores = set()

    def Assign(tensor, core):
        out = tf.identity(tensor)  # made where the annotation is made
        cores.add((core, out.op.device[-1:]))
        return out

    x, _ = _Data()
    graph = pipe.pipeline

    @tf.function(autograph=False)
    def Step():
        with placement.LogicalCores(Assign, DEVICES), tf.GradientTape() as tape:
            loss = tf.reduce_sum(graph.FProp(graph.theta, x))
        return tape.gradient(loss, graph.theta)

    assert all(g is not None for g in Step())
    assert {core for core, _ in cores} == {0, 1, 2}
    assert all(device == str(core + 1) for core, device in cores), cores


def _TokenClassifier():
    """ids [batch, time] -> Embedding(1000, 16) -> Dense(16) -> pooled logits [batch, 2]."""
    ids = keras.Input((None,), dtype="int32", name="ids")
    h = keras.layers.Embedding(1000, 16, name="embed")(ids)
    h = keras.layers.Dense(16, activation="relu", name="ff")(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(ids, keras.layers.Dense(2, name="logits")(h))


class _TokenAndPosition(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(1000, 8)
        self.positions = keras.layers.Embedding(4, 8)

    def call(self, ids):
        return self.tokens(ids) + self.positions(keras.ops.arange(4))


def _NestedEmbedding():
    ids = keras.Input((4,), dtype="int32")
    h = _TokenAndPosition(name="embed")(ids)
    return keras.Model(ids, keras.layers.Dense(2)(keras.layers.Flatten()(h)))


def test_an_embedding_is_costed_as_a_lookup_and_unknown_dims_print_as_none():
    from lingpipe.keras import graph as graph_lib

    graph = graph_lib.Trace(_TokenClassifier(), "test")
    embed = next(n for n in graph.nodes if n.name == "embed")
    # One row read per token: its output elements, not 2 x rows x its 16,000 weights.
    assert graph_lib.NodeFlops(embed) == 16
    # Also where a layer of the user's own holds the lookups (keras.io's token and
    # position embedding): its output elements (4 tokens x 8), not 2 x 4 x 8,032.
    nested = graph_lib.Trace(_NestedEmbedding(), "test")
    assert graph_lib.NodeFlops(nested.nodes[0]) == 4 * 8
    pipe = lpk.Pipeline(
        _TokenClassifier(),
        num_stages=2,
        num_micro_batches=2,
        split_points=["ff"],
        devices=DEVICES[:2],
    )
    assert "embed [batch, None, 16] float32" in str(pipe.pipeline.PartitionReport())


def test_profiling_times_forward_and_backward_and_changes_no_state():
    """ProfileNodes runs each layer call in training mode (the backward needs it) under a
    keras.StatelessScope: batch norm's moving statistics and dropout's seed stay as
    they were."""
    from lingpipe.keras import graph as graph_lib

    x = keras.Input((8,))
    h = keras.layers.Dense(16, name="dense")(x)
    h = keras.layers.BatchNormalization(name="bn")(h)
    model = keras.Model(x, keras.layers.Dropout(0.5, seed=1, name="drop")(h))
    state = [v for layer in model.layers for v in layer.variables if not v.trainable]
    assert len(state) == 3  # moving mean, moving variance, the dropout's seed state
    before = [v.numpy().copy() for v in state]
    times = graph_lib.ProfileNodes(graph_lib.Trace(model, "test"), repeats=1)
    assert [t.forward > 0 and t.backward >= 0 for t in times] == [True] * 3
    for v, b in zip(state, before):
        np.testing.assert_array_equal(v.numpy(), b, err_msg=v.path)


def test_a_ragged_input_is_refused_naming_how_to_make_it_dense():
    ids = keras.Input((None,), name="ids")
    h = keras.layers.Dense(4)(keras.layers.Embedding(10, 4)(ids))
    pipe = lpk.Pipeline(keras.Model(ids, keras.layers.Dense(2)(h)), 2, 2, devices=DEVICES[:2])
    with pytest.raises(ValueError, match=r"received a tf.RaggedTensor for input 'ids'.*"
                       r"\(pass x.to_tensor\(\)\)"):  # fmt: skip
        pipe.predict(tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]]), verbose=0)

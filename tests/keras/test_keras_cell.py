"""KerasCell: Keras 3 layers as pipeline cells, beside lingpipe's own cells."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, optimizers, seeds, test_utils
from lingpipe.layers import gpipe, keras_cell, linear
from lingpipe.nested_map import NestedMap

DEVICES = ["/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]


def _Cells():
    """Keras Dense+Dropout, a lingpipe projection, Keras LayerNorm+Dense: [b, 4] -> [b, 3]."""
    first = keras_cell.KerasCell.FromKeras(
        [keras.layers.Dense(6, activation="relu"), keras.layers.Dropout(0.5)], input_shape=[4]
    )
    middle = linear.ProjectionLayer.Params().Set(input_dims=6, output_dims=5, activation="TANH")
    last = keras_cell.KerasCell.FromKeras(
        [keras.layers.LayerNormalization(), keras.layers.Dense(3)], input_shape=[5]
    )
    return [first, middle, last]


def _Pipeline(**kwargs):
    p = gpipe.PipeliningLayer.Params().Set(
        name="pipe", cell_tpl=_Cells(), num_stages=3, num_micro_batches=4, devices=DEVICES
    )
    return p.Set(**kwargs).Instantiate()


def test_params_are_literal_text_that_reads_back():
    p = _Cells()[0]
    text = p.ToText()
    assert "<" not in text, text  # every value has a text form: nothing opaque
    back = keras_cell.KerasCell.Params().FromText(text)
    assert back.layers == p.layers and back.input_shape == [4]
    assert back.layers[0]["class_name"] == "Dense"


def test_mixed_pipeline_matches_the_sequential_reference_with_keras_dropout_on():
    pipe = _Pipeline()
    x = tf.constant(np.random.RandomState(0).randn(8, 4), tf.float32)
    variables = pipe.trainable_variables

    @tf.function(autograph=False)
    def Both():
        out = []
        for fn in (pipe.FProp, pipe.FPropSequential):
            with seeds.StepSeedScope(7), tf.GradientTape() as tape:
                y = fn(pipe.theta, x)
                loss = tf.reduce_sum(y * y)
            out.append((y, tape.gradient(loss, variables)))
        return out

    (y, grads), (y_ref, grads_ref) = Both()
    test_utils.AssertAllClose(y, y_ref)
    test_utils.AssertAllCloseToScale(grads, grads_ref)
    assert all(g is not None for g in grads)
    # Dropout(0.5) really drops in training (stateless seeds shared by both paths)...
    with seeds.StepSeedScope(7):
        first = pipe.cell_0.FProp(pipe.theta.cell_0, x)
    assert 0 < np.mean(first.numpy() == 0) < 1
    # ...and the schedule's executor gives the same gradients (the mean of 4 micro-batches').
    loss_fn = lambda y, _: NestedMap(loss=(tf.reduce_sum(y * y), 1.0))  # noqa: E731
    with seeds.StepSeedScope(7):
        fb = tf.function(lambda: pipe.ForwardBackward(pipe.theta, x, loss_fn))()
    fb_grads = [fb.theta_grads.GetItem(k) for k, _ in pipe.theta.FlattenItems()]
    by_ref = dict(zip([v.ref() for v in variables], grads_ref))
    expected = [by_ref[v.ref()] / 4 for _, v in pipe.theta.FlattenItems()]
    test_utils.AssertAllCloseToScale(fb_grads, expected)


def test_weights_are_the_cells_variables_on_its_stage_device_by_path(tmp_path):
    pipe = _Pipeline()
    cell = pipe.cell_2
    assert sorted(cell.vars) == ["layer0_beta", "layer0_gamma", "layer1_bias", "layer1_kernel"]
    for v in cell.variables:
        assert v.device.endswith("CPU:3") and v.name.startswith("pipe/cell_2/"), v.name
    # The Keras layer computes with exactly these variables.
    assert {w.value.ref() for w in cell.keras_layers[1].weights} == {
        cell.vars.layer1_kernel.ref(),
        cell.vars.layer1_bias.ref(),
    }
    report = pipe.PartitionReport([[8, 4]])
    assert [s.num_params for s in report.stages] == [30, 35, 28]
    # lingpipe's optimizers put their slots beside the Keras weights.
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(pipe.trainable_variables)
    by_name = {v.name[: -len(":0")]: v.device for v in pipe.trainable_variables}
    for slot in opt.SlotVariables():
        owner = next(n for n in by_name if n.replace("/", "_") in slot.name)
        assert slot.device == by_name[owner], (slot.name, slot.device)
    # Checkpoints key the weights by layer path, and restore into a fresh pipeline.
    path = tf.train.Checkpoint(model=pipe).write(str(tmp_path / "ckpt"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert "model/cell_0/layer0_kernel/.ATTRIBUTES/VARIABLE_VALUE" in names
    fresh = _Pipeline()
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    with base_layer.EvalMode():
        test_utils.AssertAllClose(fresh(tf.ones([8, 4])), pipe(tf.ones([8, 4])), rtol=0, atol=0)


def test_partition_by_params_and_flops_uses_keras_shapes_and_weight_counts():
    last = _Cells()[2]
    with test_utils.CountVariables() as counter:
        meta = keras_cell.KerasCell.FPropMeta(last, [8, 5])
    assert counter.count == 0
    assert meta.out_shapes[0].as_list() == [8, 3] and meta.num_params == 10 + 18
    # 2 * rows * weights + output elements, for each layer.
    assert meta.flops == (2 * 8 * 10 + 8 * 5) + (2 * 8 * 18 + 8 * 3)
    pipe = _Pipeline(partition="params", input_shapes=[[8, 4]], num_stages=2, devices=DEVICES[:2])
    assert pipe.stage_cells == [[0], [1, 2]]
    pipe = _Pipeline(partition="flops", input_shapes=[[8, 4]], num_stages=2, devices=DEVICES[:2])
    assert pipe.PartitionReport().stages[0].flops > 0


def test_errors_name_what_was_received_and_expected():
    with pytest.raises(TypeError, match=r"expected Keras 3 layers .* received int at \[1\]: 3"):
        keras_cell.KerasCell.FromKeras([keras.layers.Dense(2), 3], input_shape=[4])
    bad = keras_cell.KerasCell.Params().Set(
        name="k", input_shape=[4], layers=[{"class_name": "NoSuchLayer", "config": {}}]
    )
    with pytest.raises(ValueError, match=r"k: layers\[0\] \(class_name='NoSuchLayer'\) cannot be"):
        bad.Instantiate()
    with pytest.raises(ValueError, match=r"layers\[0\] must be a Keras layer config"):
        bad.Copy().Set(layers=["Dense"]).Instantiate()
    bn = keras_cell.KerasCell.FromKeras(keras.layers.BatchNormalization(), input_shape=[4])
    with pytest.raises(ValueError, match=r"non-trainable weights \['moving_mean', 'moving_var"):
        bn.Set(name="bn").Instantiate()
    with pytest.raises(ValueError, match=r"input_shape.* received input_shape=None"):
        keras_cell.KerasCell.Params().Set(name="k", layers=_Cells()[0].layers).Instantiate()


def test_a_lambda_of_a_keras_function_builds_after_its_flops_were_counted():
    # Keras' Lambda.from_config rewrites the config it is given: the second rebuild of
    # the same params (FPropMeta, then the cell) failed before each rebuild took a copy.
    p = keras_cell.KerasCell.FromKeras(
        [keras.layers.Dense(4), keras.layers.Lambda(keras.activations.relu)], input_shape=[3]
    )
    assert keras_cell.KerasCell.FPropMeta(p, [2, 3]).flops > 0
    cell = p.Set(name="cell").Instantiate()
    assert cell(tf.ones([2, 3])).shape == (2, 4)

"""PipeliningLayer errors name what was received and what was expected."""

import numpy as np
import pytest
import tensorflow as tf
from gpipe_cells import DIMS, Mlp, Pipeline, Transformer

from lingpipe import base_layer
from lingpipe.layers import gpipe


def test_more_stages_than_cells():
    with pytest.raises(
        ValueError,
        match=r"pipe: num_stages=5 is greater than the number of "
        r"cells \(4 in cell_tpl\)",
    ):
        Pipeline([Mlp()] * 4, 5, 1)


def test_more_stages_than_devices():
    with pytest.raises(
        ValueError,
        match="pipe: num_stages=9: StageDevices: asked for 9 devices "
        "for pipeline stages but this machine has 8 CPU device",
    ):
        Pipeline([Mlp()] * 10, 9, 1)
    with pytest.raises(
        ValueError,
        match=r"pipe: expected one device per stage, received 2 "
        r"device\(s\) \['/cpu:0', '/cpu:1'\] for num_stages=3",
    ):
        Pipeline([Mlp()] * 4, 3, 1, devices=["/cpu:0", "/cpu:1"])


def test_device_that_does_not_exist():
    with pytest.raises(
        ValueError,
        match=r"pipe: device '/device:GPU:3' does not exist; this "
        r"process has \['/device:CPU:0'",
    ):
        Pipeline([Mlp()] * 4, 2, 1, devices=["/device:CPU:0", "/device:GPU:3"])


def test_explicit_devices_are_used_in_order():
    pipe = Pipeline([Mlp()] * 4, 2, 1, devices=["CPU:5", "/cpu:2"])
    assert pipe.devices == ["/device:CPU:5", "/device:CPU:2"]
    assert pipe.cell_3.vars.w.device.endswith("CPU:2")


@pytest.mark.parametrize("m", [0, -2])
def test_num_micro_batches_below_one(m):
    with pytest.raises(
        ValueError,
        match=f"pipe: expected num_micro_batches to be a positive "
        f"integer, received num_micro_batches={m}",
    ):
        Pipeline([Mlp()] * 2, 1, m)


def test_more_micro_batches_than_rows():
    pipe = Pipeline([Mlp()] * 2, 2, 8)
    with pytest.raises(
        ValueError,
        match="pipe: expected 1 <= num_micro_batches <= batch size, "
        "received num_micro_batches=8, batch=5",
    ):
        pipe(tf.ones([5, DIMS]))


def test_batch_smaller_than_micro_batches_at_run_time_says_so_in_one_line():
    pipe = Pipeline([Mlp()] * 2, 2, 4)
    fn = tf.function(lambda x: pipe(x), input_signature=[tf.TensorSpec([None, DIMS])])
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        fn(tf.ones([3, DIMS]))
    line = "pipe: batch 3 is smaller than num_micro_batches=4; give batches of at least 4 rows"
    lines = [ln for ln in str(info.value).splitlines() if "pipe: batch" in ln]
    assert lines and all(ln.endswith(f"[{line} or lower num_micro_batches]") for ln in lines)


def test_micro_batch_size_needs_a_known_batch():
    pipe = Pipeline([Mlp()] * 2, 2, 1, micro_batch_size=2)
    fn = tf.function(lambda x: pipe(x), input_signature=[tf.TensorSpec([None, DIMS])])
    with pytest.raises(
        ValueError,
        match=r"pipe: micro_batch_size=2 needs a batch size known at trace time, received a "
        r"batch of unknown size \(None\)",
    ):
        fn.get_concrete_function()


def test_cell_output_that_does_not_fit_the_next_cell():
    # A transformer cell takes (x, paddings); an MLP cell returns a single tensor.
    pipe = Pipeline([Mlp(), Transformer()], 2, 2)
    with pytest.raises(
        ValueError,
        match=r"pipe: cell_1 \(TransformerCell\) cannot take "
        r"cell_0's outputs: 1 value\(s\) \('float32\[2, 8\]',\) for "
        r"FProp\(theta, x, paddings\)",
    ):
        pipe(tf.ones([4, DIMS]))
    first = Pipeline([Transformer(), Mlp()], 2, 1)
    with pytest.raises(ValueError, match="pipe: cell_0 .* cannot take the pipeline's inputs"):
        first(tf.ones([4, 3, DIMS]))


def test_explicit_partition_that_does_not_add_up():
    with pytest.raises(
        ValueError,
        match=r"pipe: explicit partition \[2, 3\] adds up to 5 "
        r"cells, but cell_tpl has 4",
    ):
        Pipeline([Mlp()] * 4, 2, 1, partition=[2, 3])
    with pytest.raises(ValueError, match=r"pipe: explicit partition \[4\] has 1 stage"):
        Pipeline([Mlp()] * 4, 2, 1, partition=[4])


def test_unknown_policies_and_missing_shapes():
    with pytest.raises(
        ValueError,
        match=r"pipe: expected remat to be one of always, except_last, never or a list of "
        r"them with one per stage \(1 stage\), received remat='sometimes'",
    ):
        Pipeline([Mlp()] * 2, 1, 1, remat="sometimes")
    with pytest.raises(
        ValueError,
        match=r"pipe: expected partition to be one of \['uniform', "
        r"'flops', 'params', 'profile'\], received partition='even'; or give "
        r"a list of cell counts per stage",
    ):
        Pipeline([Mlp()] * 2, 1, 1, partition="even")
    with pytest.raises(ValueError, match=r"pipe: partition='flops' needs input_shapes"):
        Pipeline([Mlp()] * 2, 2, 1, partition="flops")


@pytest.mark.parametrize(
    "kw,stages,received",
    [
        (dict(num_stages=4), 4, "['always', 'never']"),
        (dict(num_stages=2, remat=["always", "sometimes"]), 2, "['always', 'sometimes']"),
        (dict(num_stages=2, schedule="zbv"), 4, "['always', 'never']"),  # 2 per device
        (dict(num_stages=2, schedule="interleaved_1f1b", num_virtual_stages=2), 4, None),
        (dict(num_stages=2, remat=("never",) * 3), 2, "('never', 'never', 'never')"),
    ],
)
def test_remat_per_stage_has_one_known_policy_per_stage_of_the_schedule(kw, stages, received):
    kw = dict(dict(remat=["always", "never"]), **kw)
    received = received or repr(kw["remat"])
    with pytest.raises(ValueError) as e:
        Pipeline([Mlp()] * 4, num_micro_batches=2, **kw)
    assert str(e.value) == (
        "pipe: expected remat to be one of always, except_last, never or a list of them with "
        f"one per stage ({stages} stages), received remat={received}"
    )


def test_bad_cell_tpl():
    with pytest.raises(ValueError, match="pipe: cell_tpl is empty"):
        Pipeline([], 1, 1)
    with pytest.raises(
        ValueError,
        match=r"pipe: cell_tpl\[1\] is not the params of a layer, "
        r"received str",
    ):
        Pipeline([Mlp(), "fc"], 1, 1)
    with pytest.raises(ValueError, match="pipe: expected cell_tpl to be a list of layer params"):
        gpipe.PipeliningLayer.Params().Set(name="pipe", cell_tpl=Mlp()).Instantiate()


class _FailsOnMicroBatch2(base_layer.BaseLayer):
    """Passes x through, but fails on micro-batch 2: eagerly by its values (the rows
    of micro-batch m hold m), when traced by its shape (batch 10, M=4: 3, 3, 2, 2 rows)."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.Define("fail", True, "False: only pass x through.")
        return p

    def FProp(self, theta, x):
        if not self.params.fail:
            return x
        if not tf.executing_eagerly():
            if x.shape[0] == 2:
                raise ValueError(f"expected 3 rows, received {x.shape[0]}")
            return x
        tf.debugging.assert_none_equal(x[0, 0], 2.0, message="a row of micro-batch 2")
        return x


def test_an_action_that_fails_is_named_with_its_device_list():
    # Eagerly the failure comes as the action runs: fill-drain, device 1 runs its four
    # forwards, then its backwards from the last micro-batch.
    cells = [_FailsOnMicroBatch2.Params().Set(fail=False), _FailsOnMicroBatch2.Params()]
    pipe = Pipeline(cells, 2, 4)
    x = tf.constant(np.repeat(np.arange(4.0), 2)[:, None] * np.ones([8, DIMS]), tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        with tf.GradientTape():
            pipe.FProp(pipe.theta, x)
    message = str(info.value)
    assert "pipeline: F s1 mb2 on device 1 (/device:CPU:1) failed: InvalidArgumentError" in message
    assert "a row of micro-batch 2" in message
    assert "runs: F s1 mb0, F s1 mb1, >> F s1 mb2 <<, F s1 mb3, B s1 mb3, B s1 mb2" in message
    # Traced, it fails as the action is built; under 1F1B device 1 alternates.
    pipe = Pipeline([Mlp(), _FailsOnMicroBatch2.Params()], 2, 4, schedule="1f1b")
    loss_fn = lambda y, _: {"loss": (tf.reduce_sum(y), 1.0)}  # noqa: E731
    step = tf.function(lambda x: pipe.ForwardBackward(pipe.theta, (x,), loss_fn).metrics)
    with pytest.raises(ValueError, match="expected 3 rows, received 2") as info:
        step.get_concrete_function(tf.TensorSpec([10, DIMS]))
    assert "pipeline: F s1 mb2 on device 1" in str(info.value)
    assert "runs: F s1 mb0, B s1 mb0, F s1 mb1, B s1 mb1, >> F s1 mb2 <<" in str(info.value)

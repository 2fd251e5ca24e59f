"""BaseTask and SingleTaskModel, with a linear regression task checked against numpy.

The task predicts y = x @ w + b with an MSE loss, so its gradients are by hand:
dL/dw = 2/N x^T r and dL/db = 2/N sum(r), where r = x @ w + b - y. With SGD the
applied update is lr * gradient, which the tests read back from the weights.
"""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import base_layer, hyperparams, lr_schedules, optimizers
from lingpipe.layers import linear
from lingpipe.models import base_task
from lingpipe.nested_map import NestedMap

N, D = 8, 3
W = np.array([[0.5], [-1.0], [0.25]], np.float32)
B = np.array([0.3], np.float32)


class Regression(base_task.BaseTask):
    """y = x @ w + b: a LinearLayer and a BiasLayer; MSE loss."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.name = "regression"
        p.Define("input_dims", D, "Size of the last dimension of x.")
        p.Define("proj_tpl", linear.LinearLayer.Params(), "The weights w.")
        p.Define("bias_tpl", linear.BiasLayer.Params(), "The bias b.")
        return p

    def __init__(self, params):
        super().__init__(params)
        p = self.params
        self.CreateChild("proj", p.proj_tpl.Copy().Set(input_dims=p.input_dims, output_dims=1))
        self.CreateChild("bias", p.bias_tpl.Copy().Set(dims=1))

    def ComputePredictions(self, theta, input_batch):
        y = self.bias.FProp(theta.bias, self.proj.FProp(theta.proj, input_batch.x))
        return y[:, 0]  # [batch]

    def ComputeLoss(self, theta, predictions, input_batch):
        n = tf.cast(tf.shape(predictions)[0], tf.float32)
        error = predictions - input_batch.y
        return NestedMap(
            loss=(tf.reduce_mean(tf.square(error)), n),
            mae=(tf.reduce_mean(tf.abs(error)), n),
            eval_mode=(tf.constant(float(self.do_eval)), 1.0),
        )


def _Task(optimizer=None, **train):
    p = Regression.Params()
    p.train.optimizer = optimizer or optimizers.SGD.Params()
    p.train.Set(**train)
    task = p.Instantiate()
    task.proj.vars.w.assign(W)
    task.bias.vars.b.assign(B)
    return task


def _Batch(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=[N, D]).astype(np.float32)
    y = rng.normal(size=[N]).astype(np.float32)
    return NestedMap(x=tf.constant(x), y=tf.constant(y)), x, y


def _HandGrads(x, y, w=W, b=B):
    r = (x @ w + b)[:, 0] - y
    return 2.0 / N * x.T @ r[:, None], 2.0 / N * np.sum(r, keepdims=True)


def _Step(task, batch, step=0):
    """One TrainStep inside tf.function; returns (metrics as numpy, applied w and b deltas)."""
    w0, b0 = task.proj.vars.w.numpy(), task.bias.vars.b.numpy()
    metrics = tf.function(task.TrainStep)(batch, tf.constant(step, tf.int64))
    metrics = tf.nest.map_structure(np.asarray, metrics)
    return metrics, w0 - task.proj.vars.w.numpy(), b0 - task.bias.vars.b.numpy()


def test_default_params():
    p = base_task.BaseTask.Params()
    assert p.input is None
    assert p.train.optimizer.cls is optimizers.Adam
    assert p.train.lr_schedule.cls is lr_schedules.Constant
    assert (p.train.learning_rate, p.train.max_steps) == (1e-3, 1000)
    assert (p.train.clip_gradient_norm_to_value, p.train.l2_regularizer_weight) == (0.0, 0.0)
    assert p.eval.samples_per_summary == 1000


def test_fprop_gives_metrics_as_value_weight_pairs():
    task = _Task()
    batch, x, y = _Batch()
    metrics = task.FProp(task.theta, batch)
    assert sorted(metrics) == ["eval_mode", "loss", "mae"]
    error = (x @ W + B)[:, 0] - y
    np.testing.assert_allclose(metrics.loss[0], np.mean(error**2), rtol=1e-6)
    np.testing.assert_allclose(metrics.mae[0], np.mean(np.abs(error)), rtol=1e-6)
    assert float(metrics.loss[1]) == N and float(metrics.eval_mode[0]) == 0.0


def test_eval_step_runs_in_eval_mode():
    task = _Task()
    batch, _, _ = _Batch()
    metrics = tf.function(task.EvalStep)(batch)
    assert float(metrics.eval_mode[0]) == 1.0
    np.testing.assert_allclose(metrics.loss[0], task.FProp(task.theta, batch).loss[0])


def test_train_step_applies_the_hand_computed_gradients():
    task = _Task(learning_rate=0.1)
    task.CreateOptimizer()
    batch, x, y = _Batch()
    metrics, dw, db = _Step(task, batch)
    gw, gb = _HandGrads(x, y)
    np.testing.assert_allclose(dw, 0.1 * gw, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, 0.1 * gb, rtol=1e-5, atol=1e-7)
    norm = np.sqrt(np.sum(gw**2) + np.sum(gb**2))
    np.testing.assert_allclose(metrics.grad_norm, (norm, 1.0), rtol=1e-5)
    np.testing.assert_allclose(metrics.learning_rate, (0.1, 1.0), rtol=1e-6)
    assert "l2_loss" not in metrics


def test_clipping_by_global_norm():
    batch, x, y = _Batch()
    gw, gb = _HandGrads(x, y)
    norm = np.sqrt(np.sum(gw**2) + np.sum(gb**2))
    clip = 0.25 * norm
    task = _Task(learning_rate=1.0, clip_gradient_norm_to_value=float(clip))
    task.CreateOptimizer()
    metrics, dw, db = _Step(task, batch)
    np.testing.assert_allclose(dw, gw * clip / norm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, gb * clip / norm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics.grad_norm[0], norm, rtol=1e-5)  # Before clipping.
    # A bound above the norm changes nothing.
    loose = _Task(learning_rate=1.0, clip_gradient_norm_to_value=float(2 * norm))
    loose.CreateOptimizer()
    _, dw, _ = _Step(loose, batch)
    np.testing.assert_allclose(dw, gw, rtol=1e-5, atol=1e-7)


def test_l2_term_skips_layers_that_set_skip_lp_regularization():
    p = Regression.Params()
    p.bias_tpl.skip_lp_regularization = True
    p.train.Set(optimizer=optimizers.SGD.Params(), learning_rate=1.0, l2_regularizer_weight=0.1)
    task = p.Instantiate()
    task.proj.vars.w.assign(W)
    task.bias.vars.b.assign(B)
    assert [v.name for v in base_task.LpRegularizedVariables(task)] == ["regression/proj/w:0"]
    task.CreateOptimizer()
    batch, x, y = _Batch()
    metrics, dw, db = _Step(task, batch)
    np.testing.assert_allclose(metrics.l2_loss, (0.1 * np.sum(W**2) / 2, 1.0), rtol=1e-6)
    gw, gb = _HandGrads(x, y)
    np.testing.assert_allclose(dw, gw + 0.1 * W, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, gb, rtol=1e-5, atol=1e-7)
    error = (x @ W + B)[:, 0] - y
    np.testing.assert_allclose(metrics.loss[0], np.mean(error**2), rtol=1e-6)  # Without L2.


def test_l2_term_covers_every_layer_by_default():
    task = _Task()
    names = sorted(v.name for v in base_task.LpRegularizedVariables(task))
    assert names == ["regression/bias/b:0", "regression/proj/w:0"]


def test_learning_rate_is_the_base_rate_times_the_schedule():
    schedule = lr_schedules.LinearWarmupRsqrt.Params().Set(warmup_steps=4)
    batch, x, y = _Batch()
    gw, _ = _HandGrads(x, y)
    for step in (0, 2, 8):
        task = _Task(learning_rate=0.5, lr_schedule=schedule)
        task.CreateOptimizer()
        metrics, dw, _ = _Step(task, batch, step)
        expected = 0.5 * min((step + 1) / 4, np.sqrt(4 / (step + 1)))
        np.testing.assert_allclose(metrics.learning_rate[0], expected, rtol=1e-6)
        np.testing.assert_allclose(dw, expected * gw, rtol=1e-5, atol=1e-7)


def test_a_few_train_steps_in_a_tf_function_reduce_the_loss():
    task = _Task(optimizer=optimizers.Adam.Params(), learning_rate=0.05)
    task.CreateOptimizer()
    batch, _, _ = _Batch()
    train_step = tf.function(task.TrainStep)
    losses = [float(train_step(batch, tf.constant(s, tf.int64)).loss[0]) for s in range(8)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert train_step.experimental_get_tracing_count() == 1


def test_create_optimizer_builds_slots_and_is_checkpointed_with_the_task(tmp_path):
    task = _Task(optimizer=optimizers.Adam.Params())
    before = [v.name for v in task.trainable_variables]
    opt = task.CreateOptimizer()
    assert task.optimizer is opt and opt.built
    assert len(opt.SlotVariables()) == 2 * len(before)  # Adam's m and v.
    assert [v.name for v in task.trainable_variables] == before
    path = tf.train.Checkpoint(task=task).write(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path)]
    assert any(name.startswith("task/optimizer/") for name in saved), saved


def test_create_input_generator():
    class FakeInput:
        def __init__(self, params):
            self.params = params

    p = Regression.Params()
    p.input = hyperparams.InstantiableParams(FakeInput)
    assert isinstance(p.Instantiate().CreateInputGenerator(), FakeInput)


def test_missing_input():
    task = _Task()
    with pytest.raises(ValueError) as e:
        task.CreateInputGenerator()
    assert str(e.value) == (
        "regression: params.input is not set, so there is no input to create; "
        "model_registry.GetParams(key, dataset) sets it, or set "
        "task_params.input = SomeInput.Params()"
    )
    with pytest.raises(ValueError, match=r"^regression: FProp received input_batch=None; exp"):
        task.FProp(task.theta, None)


class _BadLoss(Regression):
    """ComputeLoss returns whatever `metrics_fn(error)` gives."""

    metrics_fn = None

    def ComputeLoss(self, theta, predictions, input_batch):
        return type(self).metrics_fn(predictions - input_batch.y)


@pytest.mark.parametrize(
    "metrics_fn, message",
    [
        (
            lambda e: NestedMap(mse=(tf.reduce_mean(e**2), 1.0)),
            "regression: ComputeLoss must return a metric named 'loss' (the value to "
            "minimise), received metrics ['mse']",
        ),
        (
            lambda e: NestedMap(loss=(tf.reduce_mean(e**2), 1.0), mae=1.0),
            "regression: ComputeLoss must return each metric as a (value, weight) pair, "
            "received mae=1.0",
        ),
        (
            lambda e: [tf.reduce_mean(e**2)],
            "regression: ComputeLoss must return a NestedMap of (value, weight) pairs, "
            "received list",
        ),
        (
            lambda e: NestedMap(loss=(e**2, 1.0)),
            "regression: ComputeLoss: expected loss to be a scalar, received a value of rank 1",
        ),
    ],
)
def test_compute_loss_errors(metrics_fn, message):
    class Bad(_BadLoss):
        pass

    Bad.metrics_fn = staticmethod(metrics_fn)
    task = Bad.Params().Instantiate()
    with pytest.raises(ValueError) as e:
        task.FProp(task.theta, _Batch()[0])
    assert str(e.value) == message


def test_subclasses_must_define_predictions_and_loss():
    task = base_task.BaseTask.Params().Set(name="bare").Instantiate()
    with pytest.raises(TypeError, match=r"^BaseTask must define ComputePredictions\(self, th"):
        task.FProp(task.theta, _Batch()[0])
    with pytest.raises(TypeError, match=r"^BaseTask must define ComputeLoss\(self, theta, pr"):
        task.ComputeLoss(task.theta, None, None)


def test_optimizer_errors():
    task = _Task()
    with pytest.raises(ValueError, match=r"^regression: no optimizer yet; call task.CreateOpt"):
        task.TrainStep(_Batch()[0], 0)
    task.CreateOptimizer()
    with pytest.raises(ValueError, match=r"^regression: CreateOptimizer\(\) was already called$"):
        task.CreateOptimizer()


@pytest.mark.parametrize(
    "train, message",
    [
        (dict(learning_rate=0.0), "expected train.learning_rate > 0, received train.lear"),
        (dict(clip_gradient_norm_to_value=-1.0), "expected train.clip_gradient_norm_to_value"),
        (dict(l2_regularizer_weight=-0.1), "expected train.l2_regularizer_weight >= 0, rec"),
        (dict(max_steps=0), "expected train.max_steps to be a positive integer, received"),
    ],
)
def test_invalid_train_params(train, message):
    p = Regression.Params()
    p.train.Set(**train)
    with pytest.raises(ValueError, match=f"^regression: {message}"):
        p.Instantiate()


def test_single_task_model():
    model = base_task.SingleTaskModel.Params(Regression.Params()).Instantiate()
    task = model.GetTask()
    assert isinstance(task, Regression) and task is model.task
    assert task.proj.vars.w.name == "model/regression/proj/w:0"
    batch, _, _ = _Batch()
    np.testing.assert_allclose(
        model.FProp(model.theta, batch).loss[0], task.FProp(task.theta, batch).loss[0]
    )


def test_single_task_model_needs_task_params():
    with pytest.raises(ValueError) as e:
        base_task.SingleTaskModel.Params().Instantiate()
    assert str(e.value) == (
        "model: expected params.task to be the params of a BaseTask subclass, received None"
    )
    with pytest.raises(ValueError, match=r"received InstantiableParams for <class '.*LinearL"):
        base_task.SingleTaskModel.Params(linear.LinearLayer.Params()).Instantiate()


def test_eval_mode_context_is_restored():
    assert not base_layer.DoEval()
    task = _Task()
    task.EvalStep(_Batch()[0])
    assert not base_layer.DoEval()

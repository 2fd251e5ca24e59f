"""Tests of lingpipe.optimizers against numpy forms of Keras 3's update rules."""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import hyperparams, optimizers, test_utils

_LRS = (0.1, 0.05)  # The learning rates of the two steps: Apply must use each.


def _Setup(shapes=((2, 3), (4,))):
    """Variables with random values and two steps of random gradients for them."""
    values = [np.random.normal(size=s).astype(np.float32) for s in shapes]
    grads = [[np.random.normal(size=s).astype(np.float32) for s in shapes] for _ in _LRS]
    variables = [tf.Variable(v, name=f"w{i}") for i, v in enumerate(values)]
    return values, grads, variables


def _RunSteps(opt, variables, grads, lr_as_tensor=False):
    """Builds, then applies the steps eagerly; returns the variables after each step."""
    opt.Build(variables)
    after = []
    for step_grads, lr in zip(grads, _LRS):
        opt.Apply(step_grads, variables, tf.constant(lr) if lr_as_tensor else lr)
        after.append([v.numpy() for v in variables])
    return after


def _NumpySgd(values, grads, alpha=0.0, nesterov=False):
    ws, ms, out = [v.copy() for v in values], [np.zeros_like(v) for v in values], []
    for step_grads, lr in zip(grads, _LRS):
        for i, g in enumerate(step_grads):
            if alpha == 0.0:
                ws[i] = ws[i] - lr * g
                continue
            ms[i] = alpha * ms[i] - lr * g  # Keras: m = momentum * m - lr * g.
            ws[i] = ws[i] + (alpha * ms[i] - lr * g if nesterov else ms[i])
        out.append([w.copy() for w in ws])
    return out


def _NumpyAdam(values, grads, b1, b2, eps):
    ws = [v.copy() for v in values]
    ms, vs = [np.zeros_like(v) for v in values], [np.zeros_like(v) for v in values]
    out = []
    for t, (step_grads, lr) in enumerate(zip(grads, _LRS), start=1):
        alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        for i, g in enumerate(step_grads):
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            ws[i] = ws[i] - alpha * ms[i] / (np.sqrt(vs[i]) + eps)
        out.append([w.copy() for w in ws])
    return out


def test_sgd_one_and_two_steps():
    values, grads, variables = _Setup()
    after = _RunSteps(optimizers.SGD.Params().Instantiate(), variables, grads)
    test_utils.AssertAllClose(after, _NumpySgd(values, grads))


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_one_and_two_steps(nesterov):
    values, grads, variables = _Setup()
    p = optimizers.Momentum.Params().Set(alpha=0.8, use_nesterov=nesterov)
    after = _RunSteps(p.Instantiate(), variables, grads, lr_as_tensor=True)
    test_utils.AssertAllClose(after, _NumpySgd(values, grads, alpha=0.8, nesterov=nesterov))


def test_adam_one_and_two_steps():
    values, grads, variables = _Setup()
    p = optimizers.Adam.Params().Set(beta1=0.8, beta2=0.95, epsilon=1e-6)
    after = _RunSteps(p.Instantiate(), variables, grads)
    test_utils.AssertAllClose(after, _NumpyAdam(values, grads, 0.8, 0.95, 1e-6))


def test_adam_defaults():
    p = optimizers.Adam.Params()
    assert (p.name, p.beta1, p.beta2, p.epsilon) == ("adam", 0.9, 0.999, 1e-8)
    opt = p.Instantiate()
    assert opt.keras_optimizer.epsilon == 1e-8
    assert optimizers.Momentum.Params().alpha == 0.9


def test_adafactor_first_step_and_slot_shapes():
    values, grads, variables = _Setup(shapes=((3, 4), (5,)))
    opt = optimizers.Adafactor.Params().Instantiate()
    after = _RunSteps(opt, variables, grads[:1])[0]
    # Step 1: beta2 = 1 - 1^-0.8 = 0, so the moments are those of this gradient.
    w, g = values[0], grads[0][0]
    g2 = g * g + 1e-30
    row, col = g2.mean(axis=1), g2.mean(axis=0)
    v = np.outer(row / row.mean(), col)
    u = g / np.sqrt(v)
    u = u / max(1.0, np.sqrt(np.mean(u * u)) / 1.0)
    step = max(1e-3, np.sqrt(np.mean(w * w))) * min(_LRS[0], 1.0)
    test_utils.AssertAllClose(after[0], w - step * u)
    # The matrix keeps factored row and column moments; the vector a full one.
    shapes = sorted(tuple(s.shape) for s in opt.SlotVariables())
    assert shapes == [(3,), (3, 4), (4,), (5,)]


def test_adafactor_decreases_a_quadratic_loss():
    # Adafactor's step is relative to the variable's RMS: start away from the minimum at 0.
    w = tf.Variable(np.random.normal(size=(4, 6)).astype(np.float32), name="w")
    opt = optimizers.Adafactor.Params().Instantiate()
    opt.Build([w])
    losses = []
    for _ in range(5):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(w))
        losses.append(float(loss))
        opt.Apply(tape.gradient(loss, [w]), [w], 0.3)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize(
    "cls", [optimizers.Momentum, optimizers.Adam, optimizers.Adafactor], ids=lambda c: c.__name__
)
def test_slots_sit_on_their_variables_devices(cls):
    devices = ["/device:CPU:1", "/device:CPU:2", "/device:CPU:3"]
    variables = []
    for i, (device, shape) in enumerate(zip(devices, [(3,), (2, 4), (2, 3, 5)])):
        with tf.device(device):
            variables.append(tf.Variable(tf.ones(shape), name=f"stage{i}_w"))
    opt = cls.Params().Instantiate()
    opt.Build(variables)
    slots = opt.SlotVariables()
    for i, var in enumerate(variables):
        mine = [s for s in slots if f"stage{i}_w" in s.name]
        assert mine, [s.name for s in slots]
        spec = tf.DeviceSpec.from_string(var.device)
        for s in mine:
            slot_spec = tf.DeviceSpec.from_string(s.device)
            where = (slot_spec.device_type, slot_spec.device_index)
            assert where == (spec.device_type, spec.device_index), (s.name, s.device, var.device)
    assert len(slots) == {optimizers.Momentum: 3, optimizers.Adam: 6, optimizers.Adafactor: 7}[cls]


def test_build_while_tracing_still_places_slots_beside_their_variables():
    with tf.device("/device:CPU:2"):
        w = tf.Variable(tf.ones([2, 3]), name="w")
    opt = optimizers.Adam.Params().Instantiate()

    @tf.function
    def Step():
        opt.Build([w])
        return opt.Apply([tf.ones([2, 3])], [w], 0.1)

    assert int(Step()) == 1
    devices = {tf.DeviceSpec.from_string(s.device).device_index for s in opt.SlotVariables()}
    assert devices == {2}


def test_sgd_has_no_slots():
    opt = optimizers.SGD.Params().Instantiate()
    opt.Build([tf.Variable([1.0])])
    assert opt.SlotVariables() == []


def test_apply_inside_tf_function_matches_eager():
    values, grads, variables = _Setup()
    eager = _RunSteps(optimizers.Adam.Params().Instantiate(), variables, grads)
    traced_vars = [tf.Variable(v) for v in values]
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(traced_vars)
    step = tf.function(lambda g, lr: opt.Apply(g, traced_vars, lr))
    for step_grads, lr, expected in zip(grads, _LRS, eager):
        iterations = step(step_grads, tf.constant(lr))
        test_utils.AssertAllClose([v.numpy() for v in traced_vars], expected)
    assert int(iterations) == 2 and int(opt.iterations) == 2
    np.testing.assert_allclose(opt.learning_rate.numpy(), _LRS[-1])


def test_build_twice_with_the_same_variables_is_a_no_op():
    variables = [tf.Variable(tf.ones([2, 2]))]
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(variables)
    slots = opt.SlotVariables()
    opt.Build(variables)
    assert opt.built and opt.SlotVariables() == slots


def _Errors(opt, variables):
    """(callable, message regex) pairs for the errors of Build and Apply."""
    grads = [tf.ones_like(v) for v in variables]
    other = tf.Variable([1.0], name="other")
    return [
        (lambda: opt.Build([]), r"Build\(\) needs at least one variable, received none"),
        (lambda: opt.Build([tf.ones([2])]), r"Build\(\) expects tf.Variables, received \['"),
        (lambda: opt.Build([other]), r"already built for 1 other variables, received 1"),
        (lambda: opt.Apply(grads[:0], variables, 0.1), r"received 0 grads for 1 variables"),
        (lambda: opt.Apply([tf.ones([1])], [other], 0.1), r"variables \['other:0'\] were not"),
        (lambda: opt.Apply(grads, variables, [0.1, 0.2]), r"learning_rate to be a scalar"),
    ]


def test_build_and_apply_errors():
    variables = [tf.Variable([1.0, 2.0], name="w")]
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build(variables)
    for fn, message in _Errors(opt, variables):
        with pytest.raises(ValueError, match=message):
            fn()


def test_apply_before_build_errors_eagerly_and_in_tf_function():
    w = tf.Variable([1.0], name="w")
    opt = optimizers.Momentum.Params().Instantiate()
    message = r"Momentum 'momentum': Apply\(\) was called before Build\(\); call opt.Build"
    with pytest.raises(ValueError, match=message):
        opt.Apply([tf.ones([1])], [w], 0.1)
    with pytest.raises(ValueError, match=message):
        tf.function(lambda: opt.Apply([tf.ones([1])], [w], 0.1))()


def test_checkpoint_round_trip_restores_slots_and_iterations(tmp_path):
    values, grads, variables = _Setup()
    opt = optimizers.Adam.Params().Instantiate()
    _RunSteps(opt, variables, grads)
    path = tf.train.Checkpoint(model=variables, optimizer=opt).write(str(tmp_path / "ckpt"))

    fresh_vars = [tf.Variable(np.zeros_like(v)) for v in values]
    fresh = optimizers.Adam.Params().Instantiate()
    fresh.Build(fresh_vars)
    status = tf.train.Checkpoint(model=fresh_vars, optimizer=fresh).read(path)
    status.assert_existing_objects_matched().assert_consumed()
    assert int(fresh.iterations) == 2
    test_utils.AssertAllClose(fresh.SlotVariables(), opt.SlotVariables(), rtol=0, atol=0)
    # The next step is the same for both: Adam's bias correction reads iterations.
    opt.Apply(grads[0], variables, 0.1)
    fresh.Apply(grads[0], fresh_vars, 0.1)
    test_utils.AssertAllClose(fresh_vars, variables, rtol=0, atol=0)


def test_checkpoint_restored_before_build_fills_the_slots_at_build(tmp_path):
    values, grads, variables = _Setup(shapes=((3, 4),))
    opt = optimizers.Adafactor.Params().Instantiate()
    _RunSteps(opt, variables, grads)
    path = tf.train.Checkpoint(optimizer=opt).write(str(tmp_path / "ckpt"))
    fresh = optimizers.Adafactor.Params().Instantiate()
    tf.train.Checkpoint(optimizer=fresh).read(path)
    fresh.Build([tf.Variable(np.zeros_like(values[0]))])
    assert int(fresh.iterations) == 2
    test_utils.AssertAllClose(fresh.SlotVariables(), opt.SlotVariables(), rtol=0, atol=0)


_PARAMS_ERRORS = [
    (optimizers.SGD, {"name": "my opt"}, "expected params.name to be a Python identifier"),
    (optimizers.Momentum, {"alpha": 1.5}, r"expected alpha in \[0, 1\], received alpha=1.5"),
    (optimizers.Momentum, {"alpha": True}, r"received alpha=True"),
    (optimizers.Momentum, {"use_nesterov": 1}, "expected use_nesterov to be a bool"),
    (optimizers.Adam, {"beta1": 1.0}, r"expected beta1 in \[0, 1\), received beta1=1.0"),
    (optimizers.Adam, {"beta2": -0.1}, r"expected beta2 in \[0, 1\), received beta2=-0.1"),
    (
        optimizers.Adam,
        {"epsilon": 0.0},
        r"Adam \'adam\': expected epsilon in \(0, inf\), received epsilon=0.0",
    ),
    (
        optimizers.Adafactor,
        {"beta2_decay": 0.0},
        r"expected beta2_decay in \(-inf, 0\), received beta2_decay=0.0",
    ),
    (optimizers.Adafactor, {"epsilon_1": 0.0}, r"expected epsilon_1 in \(0, inf\)"),
    (optimizers.Adafactor, {"epsilon_2": -1e-3}, r"expected epsilon_2 in \[0, inf\)"),
    (optimizers.Adafactor, {"clip_threshold": 0}, r"received clip_threshold=0"),
    (optimizers.Adafactor, {"relative_step": "yes"}, "expected relative_step to be a bool"),
]


@pytest.mark.parametrize("cls, values, message", _PARAMS_ERRORS)
def test_params_errors(cls, values, message):
    with pytest.raises(ValueError, match=message):
        cls.Params().Set(**values).Instantiate()


def test_non_instantiable_params_error():
    with pytest.raises(TypeError, match=r"expected InstantiableParams .* received Params"):
        optimizers.Adam(hyperparams.Params())


@pytest.mark.parametrize("cls", [optimizers.SGD, optimizers.Adam])
def test_apply_under_mirrored_strategy_takes_reduced_gradients(cls):
    # Each replica hands Apply the same (already reduced) gradient; Keras alone would
    # sum the replicas' gradients again, doubling the step.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = tf.Variable([1.0, -2.0])
        opt = cls.Params().Instantiate()
        opt.Build([v])
    plain_v = tf.Variable([1.0, -2.0])
    plain = cls.Params().Instantiate()
    plain.Build([plain_v])
    grad = tf.constant([0.5, 0.25])

    def ReplicaStep():
        # Made in the replica (a captured constant would not count as per-replica).
        replica_grad = tf.identity(grad)
        opt.Apply([replica_grad], [v], 0.1)

    @tf.function
    def Step():
        strategy.run(ReplicaStep)

    Step()
    plain.Apply([grad], [plain_v], 0.1)
    for component in v.values:
        test_utils.AssertAllClose(component.numpy(), plain_v.numpy())


def _DeepModelAndAdam(value):
    """As in a layer tree: the weight lies deeper than the optimizer's own lists."""
    model = tf.Module()
    model.layer = tf.Module()
    model.layer.fc = tf.Module()
    model.layer.fc.inner = tf.Module()
    w = model.layer.fc.inner.w = tf.Variable(value, name="w")
    opt = optimizers.Adam.Params().Instantiate()
    opt.Build([w])
    return model, w, opt


def test_checkpoint_keys_weights_by_the_model_path_not_the_optimizer(tmp_path):
    model, w, opt = _DeepModelAndAdam([1.0, 2.0])
    path = tf.train.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "ckpt"))
    keys = tf.train.list_variables(path)
    names = [name for name, _ in keys]
    assert "model/layer/fc/inner/w/.ATTRIBUTES/VARIABLE_VALUE" in names
    assert not [n for n in names if "_trainable_variables" in n]
    # The slots are still saved and restore in a fresh optimizer.
    opt.Apply([tf.constant([0.5, 0.5])], [w], 0.1)
    path = tf.train.Checkpoint(model=model, optimizer=opt).write(str(tmp_path / "ckpt2"))
    fresh_model, fresh_w, fresh = _DeepModelAndAdam([0.0, 0.0])
    tf.train.Checkpoint(model=fresh_model, optimizer=fresh).read(path).assert_consumed()
    for a, b in zip(opt.SlotVariables(), fresh.SlotVariables()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(fresh.iterations.numpy()) == 1
    np.testing.assert_array_equal(fresh_w.numpy(), w.numpy())

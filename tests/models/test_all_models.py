"""Every registered model: instantiate, one pipelined training step, gradients, slot placement.

Generated over model_registry.ListKeys(): a new params class is covered the moment
it is registered. Large configs are shrunk (fewer, narrower layers; small batches)
so that one step runs on a CPU; their full size is checked by their family's tests.
"""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import model_registry

# Task fields shrunk for configs that are not *Tiny, when the task defines them.
_TASK_SHRINK = dict(
    model_dims=16,
    hidden_dims=32,
    num_heads=2,
    num_layers=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
    filters=4,
    num_normal_cells=1,
    num_reduction_cells=1,
    image_size=16,
)
_INPUT_SHRINK = dict(batch_size=4, seq_len=8, image_size=16, min_len=3, max_len=6)


def _Shrink(p):
    for params, shrink in ((p, _TASK_SHRINK), (p.input, _INPUT_SHRINK)):
        for name, value in shrink.items():
            if name in params:
                params.Set(**{name: value})


def _SmallParams(key):
    p = model_registry.GetParams(key, "Train")
    if not key.endswith("Tiny"):
        _Shrink(p)
    p.Set(num_stages=2, num_micro_batches=2)  # always pipelined: the point of the library
    return p


# The *Tiny configs train for hundreds of steps in their family's tests (and under
# every schedule in test_model_schedules); one step here would repeat that.
@pytest.mark.parametrize(
    "key",
    [
        # AmoebaNet's ImageNet config takes 30 s; its digits config and equivalence stay.
        pytest.param(k, marks=pytest.mark.extended) if k == "image.AmoebaNetImageNetGPipe" else k
        for k in model_registry.ListKeys()
        if not k.endswith("Tiny")
    ],
)
def test_registered_model_trains_one_pipelined_step(key):
    task = _SmallParams(key).Instantiate()
    assert len(set(task.pipeline.devices)) == 2
    batch = next(iter(task.CreateInputGenerator().GetDataset()))
    variables = task.trainable_variables

    with tf.GradientTape() as tape:
        loss = task.FProp(task.theta, batch).loss[0]
    grads = tape.gradient(loss, variables)
    assert np.isfinite(loss.numpy()), key
    missing = [v.name for v, g in zip(variables, grads) if g is None]
    assert not missing, f"{key}: no gradient for {missing}"

    task.CreateOptimizer()
    before = [v.numpy() for v in variables]
    step = tf.function(lambda b: task.TrainStep(b, tf.constant(0)), autograph=False)
    metrics = step(batch)
    assert np.isfinite(metrics.loss[0].numpy()), key
    # Updates were applied (a deep net's smallest gradients may be below float32
    # resolution after one step, so not every variable need move).
    changed = sum(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
    assert changed > len(variables) // 2, f"{key}: only {changed} of {len(variables)} changed"


@pytest.mark.parametrize("key", model_registry.ListKeys())
def test_optimizer_slots_sit_on_their_variables_devices(key):
    task = _SmallParams(key).Instantiate()
    task.CreateOptimizer()
    slots = task.optimizer.SlotVariables()
    assert slots, key
    by_name = {v.name.replace("/", "_").replace(":", "_"): v for v in task.trainable_variables}
    stage_devices = {v.device for v in task.trainable_variables}
    assert len(stage_devices) == 2  # the check means something: two devices in play
    for slot in slots:
        owners = [v for name, v in by_name.items() if name in slot.name]
        assert owners, f"{key}: slot {slot.name} matches no variable"
        owner = max(owners, key=lambda v: len(v.name))  # the most specific name
        assert slot.device == owner.device, (slot.name, slot.device, owner.name, owner.device)

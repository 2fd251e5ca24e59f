"""Data parallel x pipeline on 8 logical CPU devices: replicas each pipelining over their group.

R replicas of K stages (MirroredStrategy over the groups' first devices, one task copy
per group, gradients all-reduced by the strategy) must train exactly as one replica
pipelining the whole global batch, and as the plain unpipelined model.
"""

import numpy as np
import pytest
import tensorflow as tf

from lingpipe import cluster, lr_schedules, model_registry, optimizers
from lingpipe.runners import strategies, train_loop

KEY = "lm.TransformerLmTiny"


def _Params(num_stages, num_micro_batches):
    p = model_registry.GetParams(KEY, "Train")
    p.num_stages, p.num_micro_batches = num_stages, num_micro_batches
    p.train.optimizer = optimizers.SGD.Params()  # Adam's first step is ~lr * sign(g).
    p.train.learning_rate = 0.5
    p.train.lr_schedule = lr_schedules.Constant.Params()
    p.train.max_steps = 1
    return p


def _Train(
    tmp_path,
    num_stages,
    num_replicas,
    num_micro_batches,
    steps=1,
    replica_devices=None,
    reduce_gradients=train_loop.ReduceGradients,
):
    """Trains `steps` steps; returns (initial weights, task copies).

    The strategy's replicas run on `replica_devices` (default: each group's first).
    """
    groups = cluster.ReplicaDeviceGroups(num_stages, num_replicas)
    if num_replicas > 1:
        # Not the default collective all-reduce: its group keys clash between several
        # MirroredStrategy objects in one process (the trainer makes one per process).
        strategy = tf.distribute.MirroredStrategy(
            replica_devices or [g[0] for g in groups],
            cross_device_ops=tf.distribute.ReductionToOneDevice(),
        )
    else:
        strategy = tf.distribute.get_strategy()
    p = _Params(num_stages, num_micro_batches)
    p.train.max_steps = steps
    tasks = []
    for group in groups:
        with cluster.ReplicaDevices(group):
            tasks.append(p.Instantiate())
        tasks[-1].CreateOptimizer()
    initial = [v.numpy() for v in tasks[0].trainable_variables]
    trainer = train_loop.Trainer(
        tasks,
        strategy,
        tasks[0].CreateInputGenerator(),
        str(tmp_path / f"r{num_replicas}k{num_stages}"),
        train_loop.Intervals(log_steps=0, summary_steps=0, checkpoint_steps=0),
        reduce_gradients=reduce_gradients,
    )
    trainer.Train()
    return initial, tasks


def _Deltas(initial, task):
    return [v.numpy() - w for v, w in zip(task.trainable_variables, initial)]


def _AssertSameUpdate(a, b):
    """The weight updates agree within 1e-5 of the largest update (float32 sums in
    another order; some gradients are 0 in exact arithmetic and pure rounding)."""
    scale = max(float(np.max(np.abs(d))) for d in b)
    worst = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))
    assert scale > 1e-3
    assert worst <= 1e-5 * scale, f"updates differ by {worst:.3g} of scale {scale:.3g}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One replica pipelining the global batch over 4 stages, and the plain model."""
    tmp = tmp_path_factory.mktemp("reference")
    initial, (one,) = _Train(tmp, num_stages=4, num_replicas=1, num_micro_batches=4)
    plain_initial, (plain,) = _Train(tmp, num_stages=1, num_replicas=1, num_micro_batches=1)
    for a, b in zip(initial, plain_initial):
        np.testing.assert_array_equal(a, b)  # Same initial weights whatever the layout.
    return initial, _Deltas(initial, one), _Deltas(initial, plain)


@pytest.mark.parametrize(
    "num_replicas, num_stages", [(2, 4), pytest.param(4, 2, marks=pytest.mark.extended)]
)
def test_replicas_of_pipelines_train_as_one_pipeline_and_the_plain_model(
    tmp_path, reference, num_replicas, num_stages
):
    initial, one_pipeline, plain = reference
    start, tasks = _Train(tmp_path, num_stages, num_replicas, num_micro_batches=2)
    for a, b in zip(start, initial):
        np.testing.assert_array_equal(a, b)
    deltas = _Deltas(initial, tasks[0])
    _AssertSameUpdate(deltas, one_pipeline)
    _AssertSameUpdate(deltas, plain)
    # Every copy applied the same reduced gradients, each on its own group's devices.
    groups = cluster.ReplicaDeviceGroups(num_stages, num_replicas)
    for r, task in enumerate(tasks):
        for v, w in zip(task.trainable_variables, tasks[0].trainable_variables):
            np.testing.assert_array_equal(v.numpy(), w.numpy())
        devices = {cluster.CanonicalDevice(v.device) for v in task.trainable_variables}
        assert devices == set(groups[r])


def test_replicas_whose_stages_are_not_on_the_strategys_devices_average_on_the_stages(
    tmp_path, reference
):
    # The hosts layout's arrangement: the strategy's replicas run on the client's
    # devices (here CPU:6 and CPU:7) and each replica's stages on other devices (on
    # workers; here CPU:0-2 and CPU:3-5); gradients are averaged on the stages' devices.
    initial, one_pipeline, _ = reference
    start, tasks = _Train(
        tmp_path,
        num_stages=3,
        num_replicas=2,
        num_micro_batches=2,
        replica_devices=["/device:CPU:6", "/device:CPU:7"],
        reduce_gradients=train_loop.ReduceOnGradientDevices,
    )
    _AssertSameUpdate(_Deltas(initial, tasks[0]), one_pipeline)
    for v, w in zip(tasks[1].trainable_variables, tasks[0].trainable_variables):
        np.testing.assert_array_equal(v.numpy(), w.numpy())


def test_gradients_are_averaged_where_replica_0s_copy_lives_and_copied_to_each_replicas():
    strategy = tf.distribute.MirroredStrategy(
        ["/device:CPU:6", "/device:CPU:7"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    # Replica r's gradient i lives on CPU:(2r + i), as stage i of replica r would.

    def Replica():
        r = tf.distribute.get_replica_context().replica_id_in_sync_group
        grads = []
        for i in range(2):
            with tf.device(f"/device:CPU:{2 * tf.get_static_value(r) + i}"):
                grads.append(tf.fill([3], tf.cast(r, tf.float32) * 10.0 + i))
        return train_loop.ReduceOnGradientDevices(grads + [None])

    step = tf.function(lambda: strategy.run(Replica), autograph=False)
    out = step()
    assert out[2] is None
    for i in range(2):
        for got in strategy.experimental_local_results(out[i]):
            np.testing.assert_allclose(got.numpy(), [5.0 + i] * 3)  # mean of i and 10 + i
    devices = {}
    for op in step.get_concrete_function().graph.get_operations():
        if op.type in ("AddN", "RealDiv", "Identity") and op.device:
            index = tf.DeviceSpec.from_string(op.device).device_index
            devices.setdefault(op.type, set()).add(index)
    assert devices["AddN"] == devices["RealDiv"] == {0, 1}  # replica 0's gradient devices
    assert {0, 1, 2, 3} <= devices["Identity"] and not devices["Identity"] & {6, 7}


def test_the_replicas_read_disjoint_shards_of_the_global_batch():
    layout = strategies.BuildLayout("mirrored", num_stages=2)
    assert layout.num_replicas == 4 and layout.groups[3] == ["/device:CPU:6", "/device:CPU:7"]
    inp = model_registry.GetParams(KEY, "Train").input.Set(batch_size=8).Instantiate()
    dataset = layout.strategy.distribute_datasets_from_function(inp.GetDataset)
    batch = next(iter(dataset))
    labels = [t.numpy() for t in layout.strategy.experimental_local_results(batch.labels)]
    assert [x.shape for x in labels] == [(2, 64)] * 4
    whole = next(iter(inp.GetDataset())).labels.numpy()
    np.testing.assert_array_equal(np.concatenate(labels), whole)


def test_layout_describes_groups_and_checks_the_batch():
    layout = strategies.BuildLayout("mirrored", num_stages=3)
    text = layout.Describe()
    assert "strategy=mirrored: 2 replica(s) of 3 stage(s)" in text
    assert "replica 1: stage 0 on /device:CPU:3, stage 1 on /device:CPU:4" in text
    assert "idle: /device:CPU:6, /device:CPU:7" in text
    assert layout.BatchPlan(32, 3) == (
        "global batch 32 = 2 replica(s) x 16; each replica pipelines 1 micro-batch(es) "
        "of 6 and 2 of 5"
    )
    with pytest.raises(ValueError, match=r"global batch of 33 examples cannot be split evenly"):
        layout.BatchPlan(33, 2)
    with pytest.raises(ValueError, match=r"3 replica\(s\) of 3 stage\(s\) need 9 devices"):
        cluster.ReplicaDeviceGroups(3, num_replicas=3)
    with pytest.raises(ValueError, match=r"need 9 devices, but there are 8"):
        strategies.BuildLayout("mirrored", num_stages=9)


def test_gradient_norm_clipping_and_finite_checks_stay_on_each_gradients_device():
    p = _Params(num_stages=2, num_micro_batches=2)
    p.train.clip_gradient_norm_to_value = 0.5
    task = p.Instantiate()
    task.CreateOptimizer()
    strategy = tf.distribute.get_strategy()
    step = train_loop.MakeTrainStep([task], strategy)
    dataset = strategy.distribute_datasets_from_function(task.CreateInputGenerator().GetDataset)
    graph = step.get_concrete_function(iter(dataset), tf.constant(0, tf.int64)).graph
    checked = 0
    for op in graph.get_operations():
        if op.type not in ("Square", "IsFinite") or "ApplyGradients" in op.name:
            continue
        source = op.inputs[0]
        if not source.device:  # e.g. the loss's own square, outside any stage
            continue
        assert op.device and tf.DeviceSpec.from_string(op.device) == tf.DeviceSpec.from_string(
            source.device
        ), (op.name, op.device, source.device)
        checked += 1
    # A square (norm) and an is-finite check for each of the 37 gradients.
    assert checked >= 2 * 37


def test_one_task_with_distributed_variables_applies_inside_the_replicas(tmp_path, reference):
    # The TPU arrangement (one task built under the strategy's scope, its variables
    # distributed, gradients applied in each replica), here with MirroredStrategy.
    initial, _, plain = reference
    strategy = tf.distribute.MirroredStrategy(
        ["/device:CPU:0", "/device:CPU:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    with strategy.scope():
        task = _Params(num_stages=1, num_micro_batches=1).Instantiate()
        task.CreateOptimizer()
    trainer = train_loop.Trainer(
        [task],
        strategy,
        task.CreateInputGenerator(),
        str(tmp_path),
        train_loop.Intervals(log_steps=0, summary_steps=0, checkpoint_steps=0),
        apply_in_replica=True,
    )
    trainer.Train()
    deltas = _Deltas(initial, task)
    _AssertSameUpdate(deltas, plain)
    for v in task.trainable_variables:
        np.testing.assert_array_equal(v.values[0].numpy(), v.values[1].numpy())


@pytest.mark.parametrize(
    "config, message",
    [
        ("not json", r"TF_CONFIG='not json' cannot be read \(JSONDecodeError"),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}',
            r"this process's task \('worker', 3\) is not one of the 1 workers",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
            r"this process's task \('ps', 0\) is not one of the 1 workers",
        ),
    ],
)
def test_multi_worker_rejects_a_tf_config_without_this_worker(monkeypatch, config, message):
    monkeypatch.setenv("TF_CONFIG", config)
    with pytest.raises(ValueError, match=message):
        strategies.BuildLayout("multi_worker", num_stages=2)

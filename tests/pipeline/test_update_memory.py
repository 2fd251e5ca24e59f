"""The optimizer's update in the memory estimate: traced, walked, at the step's end."""

import keras
import pytest
import tensorflow as tf

from lingpipe import optimizers
from lingpipe.layers import linear
from lingpipe.pipeline.observe import memory, update_memory
from lingpipe.pipeline.schedules import generators, simulate


def test_adam_makes_slices_dense_twice_and_squares_them_sgd_scales_them():
    adam = update_memory.UpdateCostOf(keras.optimizers.Adam(1e-3))
    # Dense: (g - m) and g^2 side by side, each written into in place after.
    assert adam == update_memory.UpdateCost(dense=2.0, table=2.0, values=1.0)
    assert adam.Bytes(1000) == 2000 and adam.Bytes(1000, slice_bytes=30) == 2030
    sgd = update_memory.UpdateCostOf(keras.optimizers.SGD(0.1))
    assert sgd == update_memory.UpdateCost(dense=1.0, table=0.0, values=1.0)  # lr * g
    # lingpipe.optimizers' params and a number of slots name the same Keras updates.
    assert update_memory.UpdateCostOf(optimizers.Adam.Params()) == adam
    assert update_memory.UpdateCostOf(2) == adam and update_memory.UpdateCostOf(0) == sgd
    assert update_memory.UpdateCostOf(None) == update_memory.UpdateCost()


def test_lingpipe_s_adafactor_is_traced_on_the_probe_s_keras_variable():
    # Its build placed each slot with var.device, which a keras.Variable lacks: the
    # translation model (Adafactor) could not be planned.
    cost = update_memory.UpdateCostOf(optimizers.Adafactor.Params())
    assert cost.dense > 0


def test_an_optimizer_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(
        ValueError, match=r"^plan: expected optimizer to be a Keras .*received str$"
    ):
        update_memory.UpdateCostOf("adam", "plan")


def test_branches_that_read_the_gradient_are_held_together():
    graph = tf.Graph()
    with graph.as_default():
        g = tf.compat.v1.placeholder(tf.float32, (256,))  # 1 KiB
        before = set(graph.get_operations())
        a = tf.square(g) * 2.0  # a branch: a buffer, then written in place
        b = tf.exp(g) + 1.0  # another
        out = a + b
        ops = [op for op in graph.get_operations() if op not in before]
    # In graph order the walk holds one buffer: exp, g's last reader, writes into it.
    assert memory.op_walk.Transients(ops, {out.ref()}, held=[g])[0] == 1024
    # Run at once, the branches each hold a buffer of their own.
    assert update_memory.UpdateTransient(ops, [g]) == 2048
    with graph.as_default():
        # A third branch, written to a variable (where an update's branches end).
        variable = tf.Variable(tf.zeros(256))
        after = set(graph.get_operations())
        tf.raw_ops.AssignVariableOp(resource=variable.handle, value=tf.sqrt(g) * 3.0)
        ops += [op for op in graph.get_operations() if op not in after]
    assert update_memory.UpdateTransient(ops, [g]) == 3 * 1024


def _Mlp(dims=(64, 32, 16)):
    p = linear.ProjectionLayer.Params().Set(input_dims=dims[0], output_dims=dims[1])
    q = linear.ProjectionLayer.Params().Set(input_dims=dims[1], output_dims=dims[2])
    return [p.Set(name="a"), q.Set(name="b")]


def test_the_update_of_a_stage_s_largest_weight_comes_at_the_step_s_end():
    from lingpipe.layers import gpipe

    parent = gpipe.PipeliningLayer.Params().Set(name="pipe")
    sched = generators.Make("1f1b", 2, 4)
    kept = {(s, m) for s in range(2) for m in range(4)}
    cells = _Mlp()
    common = (parent, cells, [[0], [1]], ((8, 64),), sched, kept)
    adam = memory.Estimate(*common, optimizer=optimizers.Adam.Params())
    none = memory.Estimate(*common, optimizer=None)
    # Adam's update holds two of the stage's largest weight (the 64 x 32 matrix on
    # stage 0) at the step's end, after every backward.
    assert [s.update for s in adam] == [2 * 64 * 32 * 4, 2 * 32 * 16 * 4]
    end = max(simulate.Simulate(sched).end.values())
    assert adam[0].step_events[-1] == (end, 2 * 64 * 32 * 4)
    assert [s.update for s in none] == [0, 0] and none[0].step_events[-1][0] < end
    # Where the update is the larger, the total is the held parts and the update.
    s = adam[0]
    held = s.weights + s.gradients + s.optimizer_slots
    bigger = memory.StageMemory(s.weights, s.gradients, s.optimizer_slots, 1, 1, 1, update=10**6)
    assert bigger.total == held + 10**6


def test_asked_while_a_tf_function_traces_the_probe_is_built_eagerly():
    update_memory._COSTS.clear()  # not cached from another test: probed here
    adam = keras.optimizers.Adam(1e-3)

    @tf.function
    def Traced():
        return tf.constant(update_memory.UpdateCostOf(adam).dense)

    assert float(Traced()) == 2.0

"""costs: the partition policies both front ends share (PolicyCosts), and the profiler's
forward and backward times per unit (TimeUnit)."""

import time

import pytest
import tensorflow as tf

from lingpipe.pipeline.planning import costs, partition


def test_policy_costs_call_only_what_the_policy_needs():
    def Unused():
        raise AssertionError("a policy called another policy's costs")

    assert costs.PolicyCosts("uniform", 3, Unused, Unused, Unused) == [1.0, 1.0, 1.0]
    assert costs.PolicyCosts("flops", 2, lambda: [4, 6], Unused, Unused) == [4.0, 6.0]
    assert costs.PolicyCosts("params", 2, Unused, lambda: [0, 9], Unused) == [0.0, 9.0]
    times = [costs.UnitTimes(1.0, 2.0), costs.UnitTimes(0.5, 0.25)]
    # 'profile' balances forward and backward together: what a training step runs.
    assert costs.PolicyCosts("profile", 2, Unused, Unused, lambda: times) == [3.0, 0.75]


def test_policy_costs_errors_are_one_line():
    with pytest.raises(ValueError, match=r"partition policy 'fast': expected one of"):
        costs.PolicyCosts("fast", 2)
    with pytest.raises(ValueError, match=r"'flops': expected 3 costs, one per unit, received 2"):
        costs.PolicyCosts("flops", 3, flops=lambda: [1, 2])


def test_time_unit_times_forward_and_backward_and_returns_the_outputs():
    """A unit whose gradient sleeps 50 ms: its backward takes at least that (a sleep is a
    lower bound, whatever else the machine runs), its forward does not sleep."""
    w = tf.Variable(tf.random.stateless_normal([8, 8], [1, 2]))
    x = tf.random.stateless_normal([4, 8], [3, 4])
    calls = []

    @tf.custom_gradient
    def SlowGradient(y):
        def Grad(dy):
            return tf.numpy_function(lambda d: (time.sleep(0.05), d)[1], [dy], dy.dtype)

        return tf.identity(y), Grad

    def Call(inputs):
        calls.append(1)  # traced, not run eagerly: one trace per tf.function
        return SlowGradient(tf.tanh(tf.matmul(inputs, w)))

    times, out = costs.TimeUnit(Call, (x,), [w], repeats=2)
    assert times.backward > 0.025 and times.forward < times.backward
    assert times.total == times.forward + times.backward
    tf.debugging.assert_near(out, tf.tanh(tf.matmul(x, w)))
    assert len(calls) == 2  # the forward's trace and the forward-and-backward's


def test_counts_cut_by_policy_or_check_explicit_counts():
    assert partition.Counts("flops", [1.0, 1.0, 4.0], 2) == [2, 1]
    assert partition.Counts([1, 2], [1.0, 1.0, 4.0], 2) == [1, 2]
    with pytest.raises(ValueError, match=r"explicit partition \[1, 1\] adds up to 2 cells"):
        partition.Counts([1, 1], [1.0, 1.0, 4.0], 2)


def test_a_remembered_partition_is_a_fresh_list_each_time():
    first = partition.MinMaxPartition([1.0, 2.0, 3.0, 4.0], 2)
    first.append(99)
    assert partition.MinMaxPartition([1.0, 2.0, 3.0, 4.0], 2) == [3, 1]


def test_weight_counts_are_each_cell_s_trainable_variables_built_without_memory():
    from lingpipe import model_registry

    p = model_registry.GetParams("lm.TransformerLmTiny", "Train")
    p.vocab_size = 32768  # 16 MiB of weights: far above what anything else allocates meanwhile
    pipe_p = p.cls.PipelineParams(p)
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    counts = costs.WeightCounts(pipe_p, pipe_p.cell_tpl)
    allocated = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
    # The embedding, two transformer layers (attention, feed-forward, two norms), the
    # softmax: what the task itself builds, cell by cell.
    assert counts == (1, 16, 16, 4)
    built = p.Instantiate().trainable_variables
    assert sum(counts) == len(built)
    weights = sum(4 * v.shape.num_elements() for v in built)
    assert allocated < weights / 20, (allocated, weights)

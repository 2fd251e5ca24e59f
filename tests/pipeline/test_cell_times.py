"""cell_times.Profile: per cell F, I and W lines, an embedding's weight gradient made
dense as the executor's sum makes it."""

import pytest
import tensorflow as tf

from lingpipe.layers import embedding, gpipe, linear
from lingpipe.pipeline.planning import cell_times


def test_an_embedding_s_gradient_is_timed_dense_as_the_executor_sums_it():
    slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 4]), tf.constant([5, 3]))
    dense, plain = cell_times.Dense([slices, tf.ones([3])])
    assert not isinstance(dense, tf.IndexedSlices)
    assert dense.numpy().tolist() == [[1.0] * 3, [0.0] * 3, [0.0] * 3, [0.0] * 3, [1.0] * 3]
    assert plain.numpy().tolist() == [1.0] * 3


def test_the_profile_has_a_line_per_cell_and_kind_and_with_a_partner_b_together():
    cells = [
        embedding.EmbeddingLayer.Params().Set(name="emb", vocab_size=64, embedding_dim=8),
        linear.ProjectionLayer.Params().Set(name="proj", input_dims=8, output_dims=8),
    ]
    parent = gpipe.PipeliningLayer.Params().Set(name="pipe", cell_tpl=cells)
    specs = (tf.TensorSpec([16, 4], tf.int32),)
    times = cell_times.Profile(parent, cells, specs, sizes=(2, 8), repeats=2)
    assert times.source == "profile"
    for lines in (times.forward, times.backward_input, times.backward_weight):
        assert len(lines) == 2 and all(a >= 0 and b >= 0 for a, b in lines)
    assert times.backward_together == () and times.BackwardTogether([0], 4) is None
    paired = cell_times.Profile(parent, cells, specs, (2, 8), repeats=1, partner="/device:CPU:1")
    assert len(paired.backward_together) == len(paired.forward_together) == 2
    assert all(a >= 0 and b >= 0 for a, b in paired.backward_together + paired.forward_together)
    assert times.forward_together == ()


def test_a_long_forward_is_timed_once_and_a_short_one_as_copies_less_one(monkeypatch):
    from lingpipe.layers import linear as linear_lib

    cell = linear_lib.ProjectionLayer.Params().Set(name="p", input_dims=4, output_dims=4)
    cell = cell.Instantiate()
    x = tf.ones([2, 4])
    run = lambda *a: cell.FProp(cell.theta, *a)  # noqa: E731
    pairs = []

    def Readings(once, differences):
        monkeypatch.setattr(cell_times, "_Median", lambda fn, repeats: once)
        left = iter(differences)

        def Paired(first, second, repeats):
            pairs.append((first, second))
            return next(left)

        monkeypatch.setattr(cell_times, "_PairedDifference", Paired)

    # F of 50 ms once: each gradient kind once, in pairs: I and B less F once, W (the
    # weights' own ops after I) less I once.
    Readings(0.05, [0.02, 0.03, 0.045])
    (f, i, w, b), _ = cell_times.UnitSeconds(run, cell.trainable_variables, (x,), repeats=1)
    assert (f, i, w, b) == (0.05, 0.02, 0.03, 0.045)
    (i_run, forward), (w_run, w_less), (b_run, b_less) = pairs
    assert b_less is forward and w_less is i_run and len({i_run, w_run, b_run}) == 3
    pairs.clear()
    # F of 2 ms once: 4 copies less one, over 3 (the call and copying cancelled); I's and
    # B's 4 copies less F's 4, W's less I's, over 4: what each adds.
    Readings(0.002, [0.003, 0.004, 0.008, 0.012])
    (f, i, w, b), _ = cell_times.UnitSeconds(run, cell.trainable_variables, (x,), repeats=1)
    assert (f, i, w, b) == pytest.approx((0.001, 0.001, 0.002, 0.003))
    (forward_copies, _), (i_copies, i_less), (_, w_less), (_, b_less) = pairs
    assert i_less is forward_copies and b_less is forward_copies and w_less is i_copies


def test_w_is_timed_as_the_weights_own_ops_after_i_as_a_split_backward_runs_them():
    # y = tanh(x @ a) @ b: the gradient of tanh is on the path to both a's gradient and
    # x's, so I computes it; W is only a's and b's matmuls, and they wait for I.
    a, b = tf.Variable(tf.ones([4, 4])), tf.Variable(tf.ones([4, 2]))
    run = lambda x: tf.matmul(tf.tanh(tf.matmul(x, a)), b)  # noqa: E731
    split = tf.function(lambda x: cell_times._Once(run, [a, b], "IW", (x,)))  # noqa: SLF001
    graph = split.get_concrete_function(tf.TensorSpec([2, 4])).graph
    ops = {op.name: op for op in graph.get_operations()}
    gated = [op for op in ops.values() if op.control_inputs and op.type == "MatMul"]
    gates = {g.type for op in gated for g in op.control_inputs}
    # The two weights' matmuls (x^T dh, h^T dy) wait for a no-op over I's gradient.
    assert len(gated) == 2 and gates == {"NoOp"}
    (gate,) = {g for op in gated for g in op.control_inputs}
    (dx,) = gate.control_inputs  # x's gradient: dh @ a^T
    assert dx.type == "MatMul" and dx not in gated
    x = tf.ones([2, 4])
    both = [g.numpy() for g in split(x)]
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = run(x)
    want = tape.gradient(y, [x, a, b])
    assert all(abs(g - w.numpy()).max() < 1e-6 for g, w in zip(both, want))


def test_each_difference_is_of_readings_taken_in_pairs(monkeypatch):
    # The two functions run in turn, so that a slow spell of the machine slows both
    # readings of a pair: here the third pair's first reading is 0.5 s slower, and the
    # median of the pairs' differences leaves it out.
    calls = []
    first, second = (lambda: calls.append("first")), (lambda: calls.append("second"))
    clock = iter([0.0, 0.2, 0.2, 0.3, 0.3, 0.5, 0.5, 0.6, 1.0, 1.7, 1.7, 1.8])
    monkeypatch.setattr(cell_times.time, "perf_counter", lambda: next(clock))
    difference = cell_times._PairedDifference(first, second, repeats=3)  # noqa: SLF001
    assert difference == pytest.approx(0.1)
    assert calls == ["first", "second"] * 4  # a warm-up of each, then three pairs


def test_cells_alike_are_profiled_once_and_each_keeps_its_line(monkeypatch):
    timed = []
    real = cell_times.UnitSeconds

    def Counting(run, weights, args, repeats, copies=4):
        timed.append(tuple(args[0].shape))
        return real(run, weights, args, repeats, copies)

    monkeypatch.setattr(cell_times, "UnitSeconds", Counting)
    proj = linear.ProjectionLayer.Params().Set(input_dims=8, output_dims=8)
    wide = linear.ProjectionLayer.Params().Set(input_dims=8, output_dims=16)
    # Two alike (the same params, the same inputs), then one of another width.
    cells = [proj.Copy(), proj.Copy(), wide]
    parent = gpipe.PipeliningLayer.Params().Set(name="pipe", cell_tpl=cells)
    times = cell_times.Profile(parent, cells, (tf.TensorSpec([8, 8]),), sizes=(2, 4), repeats=1)
    assert timed == [(2, 8), (4, 8), (2, 8), (4, 8)]  # per size: the first cell, the wide one
    assert len(times.forward) == 3 and times.forward[0] == times.forward[1]


def test_b_together_runs_a_copy_on_each_device_each_reading_its_own_weights(monkeypatch):
    placed = []

    def Unit(name):
        w = tf.Variable(tf.ones([4, 4]), name=name)

        def Run(x):
            y = tf.matmul(x, w)
            placed.append((name, y.device, w.device))
            return y

        return Run, [w]

    with tf.device("/device:CPU:1"):
        there, there_w = Unit("there")
        x1 = tf.ones([2, 4])
    here, here_w = Unit("here")
    timed = []
    # F once (2 ms); F as 4 copies less F once (3 ms: 1 ms a copy); B as 4 copies less
    # F as 4 copies (8 ms: B less F, 2 ms a copy).
    monkeypatch.setattr(cell_times, "_Median", lambda fn, repeats: timed.append(fn()) or 0.002)
    readings = iter([0.003, 0.008])
    monkeypatch.setattr(
        cell_times,
        "_PairedDifference",
        lambda first, second, repeats: timed.extend([first(), second()]) or next(readings),
    )
    units = [(here, here_w, (tf.ones([2, 4]),), None), (there, there_w, (x1,), "/device:CPU:1")]
    forward, backward = cell_times.TogetherSeconds(units, repeats=1)
    assert (forward, backward) == pytest.approx((0.001, 0.002))  # F so, and B so less F
    # F once, F as copies, B as copies: three traced functions, each running both units.
    names = [name for name, _, _ in placed]
    assert names.count("here") == names.count("there") == 1 + 4 + 4
    assert {d for n, d, _ in placed if n == "there"} == {"/device:CPU:1"}
    assert {d for n, d, _ in placed if n == "here"} == {""}  # the default device
    assert all("CPU:1" in w for n, _, w in placed if n == "there")
    assert all("CPU:0" in w for n, _, w in placed if n == "here")

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


def test_a_long_kind_is_timed_once_and_a_short_one_as_copies_less_one(monkeypatch):
    from lingpipe.layers import linear as linear_lib

    cell = linear_lib.ProjectionLayer.Params().Set(name="p", input_dims=4, output_dims=4)
    cell = cell.Instantiate()
    x = tf.ones([2, 4])
    calls = []

    def Reading(seconds_once):
        def Median(fn, repeats):
            calls.append(fn)
            # The first timing of each kind is the single run; the second, 4 copies.
            return seconds_once if len(calls) % 2 else 4 * seconds_once - 0.003

        return Median

    monkeypatch.setattr(cell_times, "_Median", Reading(0.05))
    run = lambda *a: cell.FProp(cell.theta, *a)  # noqa: E731
    (f, i, w, b), _ = cell_times.UnitSeconds(run, cell.trainable_variables, (x,), repeats=1)
    assert f == 0.05 and len(calls) == 4  # one timing per kind: F, I, W, B
    calls.clear()
    monkeypatch.setattr(cell_times, "_Median", Reading(0.002))
    (f, i, w, b), _ = cell_times.UnitSeconds(run, cell.trainable_variables, (x,), repeats=1)
    # (4 x 2 ms - 3 ms - 2 ms) / 3: the 1 ms of call and copying cancelled.
    assert f == pytest.approx(0.001) and len(calls) == 8


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
    # F once, F as 4 copies, B once, B as 4 copies: F 1 ms a copy, B 3 ms (B less F: 2).
    readings = iter([0.001, 0.004, 0.002, 0.011])
    monkeypatch.setattr(
        cell_times, "_Median", lambda fn, repeats: timed.append(fn()) or next(readings)
    )
    units = [(here, here_w, (tf.ones([2, 4]),), None), (there, there_w, (x1,), "/device:CPU:1")]
    forward, backward = cell_times.TogetherSeconds(units, repeats=1)
    assert (forward, backward) == pytest.approx((0.001, 0.002))  # F so, and B so less F
    # B and F, each once and as copies: four traced functions, each running both units.
    assert len(timed) == 4
    names = [name for name, _, _ in placed]
    assert names.count("here") == names.count("there") == 2 * (1 + 4)
    assert {d for n, d, _ in placed if n == "there"} == {"/device:CPU:1"}
    assert {d for n, d, _ in placed if n == "here"} == {""}  # the default device
    assert all("CPU:1" in w for n, _, w in placed if n == "there")
    assert all("CPU:0" in w for n, _, w in placed if n == "here")

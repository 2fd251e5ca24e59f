"""lingpipe.keras.Plan and Pipeline(plan=...): the plan's knobs train as the same knobs given
by hand, the search is deterministic and never over the cap, K=1 is chosen and said when
pipelining loses, the memory estimate of a Keras graph, and every error in one line."""

import re

import keras
import numpy as np
import pytest

import lingpipe.keras as lpk
from lingpipe.keras import graph as graph_lib
from lingpipe.keras import graph_memory
from lingpipe.keras import plan as plan_lib
from lingpipe.pipeline.observe import update_memory
from lingpipe.pipeline.planning import planner
from lingpipe.pipeline.schedules import generators, simulate

DEVICES = ["/device:CPU:1", "/device:CPU:2"]
# Fixed rates: the search is a function of the model and these (MeasureRates times the machine).
FAST_LINKS = planner.Rates(flops_per_s=1e9, action_s=1e-5, bytes_per_s=1e12, latency_s=1e-7)
SLOW_LINKS = planner.Rates(flops_per_s=1e9, action_s=1e-5, bytes_per_s=1e3, latency_s=1.0)


def _Mlp(name="mlp"):
    """x [batch, 8] -> 4 Dense layers -> logits [batch, 3]."""
    x = keras.Input((8,), name="x")
    h = x
    for i, width in enumerate((32, 32, 16)):
        h = keras.layers.Dense(width, activation="tanh", name=f"dense{i}")(h)
    return keras.Model(x, keras.layers.Dense(3, name="logits")(h), name=name)


def _Copy(model):
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def _Plan(model, cap="1GiB", rates=FAST_LINKS, costs="flops", **restrictions):
    """The search's behaviour, under FLOPs costs (profiling is tested on its own)."""
    return lpk.Plan(
        model, devices=2, memory_per_device=cap, batch_size=16, rates=rates, costs=costs,
        **restrictions,
    )  # fmt: skip


def _Size(text, rounding=0.05):
    """'6.9 KiB' -> bytes (the upper end of its rounding; the lower with rounding=-0.05)."""
    number, unit = text.split()
    return int((float(number.replace(",", "")) + rounding) * {"KiB": 2**10, "MiB": 2**20}[unit])


def test_pipeline_with_a_plan_trains_as_the_same_knobs_given_by_hand():
    keras.utils.set_random_seed(1)
    model = _Mlp()
    by_hand_model = _Copy(model)
    plan = _Plan(model, num_stages=2, num_micro_batches=4, schedules="1f1b", remat="never")
    assert plan.knobs["num_stages"] == 2 and plan.knobs["schedule"] == "1f1b"
    planned = lpk.Pipeline(model, plan=plan, devices=DEVICES)
    by_hand = lpk.Pipeline(by_hand_model, devices=DEVICES, **plan.knobs)
    assert planned.pipeline.cut.stages == by_hand.pipeline.cut.stages
    rng = np.random.RandomState(0)
    x, y = rng.randn(32, 8).astype(np.float32), rng.randint(0, 3, 32)
    for m in (planned, by_hand):
        m.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(planned.get_weights(), by_hand.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_search_is_deterministic_and_never_over_the_cap():
    model = _Mlp()
    first, second = _Plan(model, cap="32KiB"), _Plan(model, cap="32KiB")
    assert first.knobs == second.knobs and str(first) == str(second)
    assert first.refused, "32 KiB refuses some candidates of this model"
    graph = graph_lib.Trace(model)
    adam = update_memory.UpdateCostOf(2)  # Adam's slots and update
    memory = graph_memory.GraphMemory(graph, graph_memory.TraceNodes(graph), 2, adam)
    for c in [first.chosen, *first.runners_up]:
        # Each plan's peaks are the estimate of the knobs it returns, under the cap.
        knobs = plan_lib.Knobs(c)
        sched = generators.Make(c.schedule, c.num_stages, c.num_micro_batches, c.num_virtual_stages)
        stages, start = [], 0
        for count in knobs["partition"]:
            stages, start = stages + [list(range(start, start + count))], start + count
        per_device = memory.PerDevice(stages, sched, knobs["remat"], 16)
        assert tuple(m.total for m in per_device) == c.peak_bytes, c.Describe()
        assert max(c.peak_bytes) <= 32 * 2**10, c.Describe()
    for r in first.refused:
        assert r.candidate.peak_bytes[r.device] == max(r.candidate.peak_bytes)
        assert r.excess_bytes == max(r.candidate.peak_bytes) - 32 * 2**10 > 0


def test_k_1_is_chosen_and_said_when_pipelining_loses():
    plan = _Plan(_Mlp(), rates=SLOW_LINKS)  # a second per transfer between devices
    assert plan.knobs["num_stages"] == 1 and not plan.pipelined
    assert "no pipeline: the model on one device" in str(plan).splitlines()[1]
    assert lpk.Pipeline(_Mlp(), plan=plan).pipeline.cut.stages == [[0, 1, 2, 3]]


def test_nothing_fits_names_the_smallest_need_and_its_candidate(monkeypatch):
    from lingpipe.pipeline.planning import planner

    def Measured(*args, **kwargs):
        raise AssertionError("rates measured, though no candidate fits the cap")

    model = _Mlp("small_mlp")
    # The rates price only candidates that fit: none here, so they are not measured.
    monkeypatch.setattr(planner, "MeasureRates", Measured)
    with pytest.raises(ValueError) as e:
        _Plan(model, cap=1024, rates=None)
    monkeypatch.undo()
    text = str(e.value)
    assert "\n" not in text
    found = re.fullmatch(
        r"lingpipe\.keras\.Plan: memory_per_device=1\.0 KiB: no plan of 'small_mlp' on 2 "
        r"device\(s\) fits; the smallest needs ([0-9.,]+ [KM]iB) per device \((R=1 x K=.*)\)",
        text,
    )
    assert found, text
    # That need is the least: a cap of it fits, and the plan found needs no more; a cap
    # below it fits nothing.
    plan = _Plan(model, cap=_Size(found.group(1)))
    assert max(plan.peak_bytes) <= _Size(found.group(1))
    with pytest.raises(ValueError, match="no plan of 'small_mlp'"):
        _Plan(model, cap=_Size(found.group(1), -0.05) - 1)


def test_a_layer_s_weights_are_counted_where_it_is_first_called():
    x = keras.Input((8,), name="x")
    shared = keras.layers.Dense(8, name="shared")
    h = shared(shared(x))
    model = keras.Model(x, keras.layers.Dense(3, use_bias=False, name="logits")(h))
    costs = plan_lib.ModelCosts(graph_lib.Trace(model))
    assert costs.weight_counts == (2, 0, 1)  # kernel and bias once; the logits' kernel
    assert sum(costs.weight_counts) == len(model.trainable_weights)
    assert sum(costs.weight_bytes) == 4 * (8 * 8 + 8 + 8 * 3)


def test_a_keras_ops_call_in_the_graph_is_planned_with_no_weights():
    # MobileNetV3's hard sigmoid is `ops.relu6(x + 3.0) / 6.0`: operations, not layers,
    # with no `weights` to read (Plan raised AttributeError: 'Add' object has no
    # attribute 'weights').
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(8, name="dense")(x)
    h = keras.ops.relu6(h + 3.0) / 6.0
    model = keras.Model(x, keras.layers.Dense(3, name="logits")(h))
    graph = graph_lib.Trace(model)
    assert graph_memory.WeightBytes(graph) == [4 * (8 * 8 + 8), 0, 0, 0, 4 * (8 * 3 + 3)]
    plan = _Plan(model)
    assert plan.peak_bytes and all(b > 0 for b in plan.peak_bytes)


def test_the_memory_of_a_keras_graph_follows_the_schedule():
    """Dense(16, tanh) -> Dense(4) on two stages, batch 8 in M=2 micro-batches of 4 rows,
    GPipe, SGD (no slots): bytes you can count by hand."""
    x = keras.Input((8,))
    h = keras.layers.Dense(16, activation="tanh")(x)
    model = keras.Model(x, keras.layers.Dense(4)(h))
    graph = graph_lib.Trace(model)
    memory = graph_memory.GraphMemory(graph, graph_memory.TraceNodes(graph), 0)
    sched = generators.Make("gpipe", 2, 2)
    keep, replay = (memory.Stages([[0], [1]], sched, r, 8) for r in ("never", "always"))
    assert [s.weights for s in keep] == [(8 * 16 + 16) * 4, (16 * 4 + 4) * 4]
    assert [s.gradients for s in keep] == [s.weights for s in keep]
    tanh_out = 4 * 16 * 4  # per micro-batch: what tanh's gradient reads
    batch = 8 * 8 * 4  # the whole batch's inputs, on stage 0
    # Kept: both micro-batches' tanh outputs on stage 0, both received activations on 1.
    assert [s.activations for s in keep] == [batch + 2 * tanh_out, 2 * 4 * 16 * 4]
    # Recomputed: stage 0 holds one replayed tanh output at a time.
    assert [s.activations for s in replay] == [batch + tanh_out, 2 * 4 * 16 * 4]
    adam = graph_memory.GraphMemory(graph, memory.nodes, 2)
    assert adam.Stages([[0], [1]], sched, "never", 8)[0].optimizer_slots == 2 * keep[0].weights


def test_a_split_backward_holds_what_w_reads_and_the_gradients_i_made_for_it():
    """The same two Dense layers under zero bubble (K=2, M=2, unit costs):
    stage 0: F0 [0,1] F1 [1,2] I0 [3,4] W0 [4,5] I1 [5,6] W1 [6,7];
    stage 1: F0 [1,2] I0 [2,3] F1 [3,4] I1 [4,5] W0 [5,6] W1 [6,7]."""
    x = keras.Input((8,))
    h = keras.layers.Dense(16, activation="tanh")(x)
    model = keras.Model(x, keras.layers.Dense(4)(h))
    graph = graph_lib.Trace(model)
    nodes = graph_memory.TraceNodes(graph)
    # The kernels' gradients (W) read each layer's input and its dz (tanh's: 16 floats an
    # example; the last layer's: the 4 of the gradient it receives); tanh's output is read
    # by I alone.
    assert [n.weight_args for n in nodes] == [tuple(g.arg_keys) for g in graph.nodes]
    assert [n.weight_outputs for n in nodes] == [(), ()]
    assert [n.deferred_bytes for n in nodes] == [16 * 4, 4 * 4]
    memory = graph_memory.GraphMemory(graph, nodes, 0)
    stages = memory.Stages([[0], [1]], generators.Make("zero_bubble", 2, 2), "never", 8)
    h_mb, dz_mb, dy_mb = 4 * 16 * 4, 4 * 16 * 4, 4 * 4 * 4  # per micro-batch of 4 rows
    # Stage 0 (and the batch): two tanh outputs in [1, 4); from I0's end, dz0 takes the
    # place of tanh's output. Stage 1 in [5, 6): micro-batches 0 and 1 both between I
    # and W, each holding its received h (W reads it) and its dy.
    assert [s.activations for s in stages] == [
        8 * 8 * 4 + max(2 * h_mb, h_mb + dz_mb), 2 * (h_mb + dy_mb),
    ]  # fmt: skip


class Wide(keras.layers.Layer):
    """One layer call, 8 -> 64 (ReLU) -> 8: its backward passes a gradient 8 times
    wider than the ones it receives and sends."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.up, self.down = keras.layers.Dense(64, activation="relu"), keras.layers.Dense(8)

    def call(self, x):
        return self.down(self.up(x))


def test_the_workspace_holds_the_widest_gradient_a_layer_call_passes_on():
    x = keras.Input((8,))
    model = keras.Model(x, keras.layers.Dense(3)(Wide()(x)))
    graph = graph_lib.Trace(model)
    nodes = graph_memory.TraceNodes(graph)
    # Per example: the [64] gradient between the two Dense layers and one [8] at once
    # (ReluGrad writes into the gradient it reads last).
    assert nodes[0].backward_transient_bytes == (64 + 8) * 4
    # Split, I holds the gradients W will read (the [8] received, the [64]) with the [8]
    # it sends.
    assert (nodes[0].input_transient_bytes, nodes[0].input_end_bytes) == ((8 + 64 + 8) * 4,) * 2
    memory = graph_memory.GraphMemory(graph, nodes, 0)
    (stage, _) = memory.Stages([[0], [1]], generators.Make("gpipe", 2, 1), "never", 16)
    weights = (8 * 64 + 64 + 64 * 8 + 8) * 4
    # A B whose runtime runs the weight-gradient ops last holds what I holds (the larger
    # walk), for 16 rows, then the weights' gradients.
    assert stage.workspace == 16 * (8 + 64 + 8) * 4 + weights


class AddPositions(keras.layers.Layer):
    """x + a learned embedding of positions 0..T-1: rows that every micro-batch looks up."""

    def build(self, shape):
        self.positions = keras.layers.Embedding(shape[1], shape[2])
        self.positions.build((shape[1],))

    def call(self, x):
        return x + self.positions(keras.ops.arange(keras.ops.shape(x)[1]))


def test_an_embedding_s_gradient_is_counted_as_the_slices_the_sums_hold():
    ids = keras.Input((8,), dtype="int32")
    h = AddPositions()(keras.layers.Embedding(5000, 16)(ids))
    outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
    graph = graph_lib.Trace(keras.Model(ids, outputs))
    nodes = graph_memory.TraceNodes(graph)
    # Per example, one slice per token: 16 float32 values and its int32 index; the
    # positions' slices are the same rows for every example, added in place.
    row = 16 * 4 + 4
    assert nodes[0].weight_gradients == (
        graph_memory.WeightGradient(5000 * 16 * 4, True, 8 * row, 0),
    )  # fmt: skip
    assert nodes[1].weight_gradients == (
        graph_memory.WeightGradient(8 * 16 * 4, True, 0, 8 * row),
    )  # fmt: skip
    adam = update_memory.UpdateCostOf(keras.optimizers.Adam())
    memory = graph_memory.GraphMemory(graph, nodes, 2, adam)
    stage, _ = memory.Stages([[0, 1], [2, 3]], generators.Make("gpipe", 2, 2), "never", 32)
    # The step's sum concatenates both micro-batches' token slices (32 rows in all),
    # not the 5000-row table; the optimizer's slots are the table's.
    slices = 32 * 8 * row
    assert stage.gradients == slices + 8 * row
    assert stage.optimizer_slots == 2 * (5000 + 8) * 16 * 4
    # Adam's update makes the table's gradient dense twice (m's and v's) and squares
    # the slices: at the step's end, on top of the slices the sum holds.
    assert stage.update == 2 * 5000 * 16 * 4 + slices
    assert stage.step_events[-1] == (
        max(simulate.Simulate(generators.Make("gpipe", 2, 2)).end.values()),
        stage.update,
    )


def test_an_explicit_knob_beside_a_plan_wins_and_warns():
    model = _Mlp()
    plan = _Plan(model, num_stages=2, num_micro_batches=4)
    with pytest.warns(UserWarning) as warned:
        pipe = lpk.Pipeline(model, plan=plan, num_micro_batches=2, devices=DEVICES)
    (w,) = warned
    assert "num_micro_batches=2 given explicitly overrides the plan's 4" in str(w.message)
    assert "\n" not in str(w.message)
    assert pipe.get_config()["num_micro_batches"] == 2


@pytest.mark.parametrize("knob", [dict(num_stages=2), dict(schedule="zbv")])
def test_an_explicit_knob_that_changes_the_stages_cuts_them_by_cost_and_says_so(knob):
    # The plan's partition counts layer calls for its own stages: with K=1 (one stage)
    # it could not cut two, or zbv's four, and the constructor failed on "[4] has 1 stage(s)".
    model = _Mlp()
    plan = _Plan(model, num_stages=1)
    assert plan.knobs["partition"] == [4]  # the layer calls, one stage
    with pytest.warns(UserWarning) as warned:
        pipe = lpk.Pipeline(model, plan=plan, devices=DEVICES, **knob)
    messages = [str(w.message) for w in warned]
    assert any("the plan's partition [4] gives way to partition='flops'" in m for m in messages)
    assert pipe.get_config()["partition"] == "flops" and len(pipe.pipeline.cut.stages) > 1


def test_auto_plans_and_a_saved_model_keeps_the_knobs_not_the_plan(tmp_path):
    model = _Mlp()
    # 32 KiB: the 4 layers' weights, gradients and Adam's slots (30 KiB) and its update
    # need 2 devices.
    pipe = lpk.Pipeline(
        model, plan="auto", memory_per_device="32KiB", batch_size=16, devices=DEVICES
    )
    config = pipe.get_config()
    assert config["num_stages"] == 2 and len(pipe.pipeline.cut.stages) >= 2
    assert not {"plan", "memory_per_device", "batch_size"} & set(config)
    knobs = {k: config[k] for k in ("num_stages", "num_micro_batches", "schedule", "remat")}
    pipe.save(str(tmp_path / "pipe.keras"))
    loaded = keras.models.load_model(str(tmp_path / "pipe.keras"))
    assert {k: loaded.get_config()[k] for k in knobs} == knobs
    assert loaded.pipeline.cut.stages == pipe.pipeline.cut.stages
    x = np.random.RandomState(0).randn(16, 8).astype(np.float32)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), pipe.predict(x, verbose=0))


def test_auto_without_memory_per_device_is_one_line():
    with pytest.raises(ValueError) as e:
        lpk.Pipeline(_Mlp(), plan="auto", batch_size=16)
    assert str(e.value) == (
        "lingpipe.keras.Pipeline: plan='auto' needs memory_per_device (e.g. '16GiB') and "
        "batch_size, received memory_per_device=None, batch_size=16"
    )


def test_a_cap_without_plan_auto_is_one_line():
    with pytest.raises(ValueError) as e:
        lpk.Pipeline(_Mlp(), memory_per_device="1GiB")
    assert str(e.value) == (
        "lingpipe.keras.Pipeline: memory_per_device and batch_size are for plan='auto', "
        "received plan=None, memory_per_device='1GiB', batch_size=None"
    )


def test_bad_sizes_and_names_are_one_line():
    model = _Mlp()
    for size in ("16XB", "-1GiB", True, 1.5):
        with pytest.raises(ValueError, match=r"expected a positive size such as 16GiB") as e:
            lpk.Plan(model, devices=2, memory_per_device=size, batch_size=16)
        assert str(e.value).startswith(f"lingpipe.keras.Plan: memory_per_device={size}")
    with pytest.raises(ValueError) as e:
        lpk.Plan(model, devices=2, memoryPerDevice="1GiB", batch_size=16)
    assert str(e.value).startswith("lingpipe.keras.Plan: unknown argument memoryPerDevice;")
    assert str(e.value).endswith("did you mean memory_per_device?")
    with pytest.raises(ValueError) as e:
        _Plan(model, remat="sometimes")
    assert str(e.value) == (
        "lingpipe.keras.Plan: expected remat to be one of ('never', 'except_last', 'always') "
        "or a list of them, received remat='sometimes'"
    )
    with pytest.raises(ValueError, match=r"expected devices to be a number of devices >= 1"):
        lpk.Plan(model, devices=0, memory_per_device="1GiB", batch_size=16)
    with pytest.raises(ValueError, match=r"the plan was made for model 'mlp' of 4 layer call"):
        lpk.Pipeline(
            keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)]), plan=_Plan(model)
        )


def test_keras_models_have_snake_case_reports_and_keep_the_camel_case_ones():
    graph_model = lpk.Pipeline(_Mlp(), num_stages=2, num_micro_batches=2, devices=DEVICES)
    sequential = lpk.PipelinedSequential(
        [keras.layers.Dense(4), keras.layers.Dense(2)],
        num_stages=2,
        input_shape=(8,),
        devices=DEVICES,
    )
    for model in (graph_model, sequential):
        table = model.stages_table()
        assert table == model.StagesTable() and DEVICES[1] in table.splitlines()[-1]
        report = model.partition_report()
        assert str(report) == str(model.PartitionReport())
        assert [s.device for s in report.stages] == DEVICES
    assert "layer calls" in str(graph_model.partition_report(batch_size=4)).splitlines()[0]


def test_layer_calls_alike_are_traced_once_and_unlike_ones_apart():
    """Two Dense(16, tanh) calls on equal inputs share a trace (tanh's gradient reads its
    output); a Dense(16) without activation reads none of its outputs."""
    x = keras.Input((16,))
    h = keras.layers.Dense(16, activation="tanh")(x)
    h = keras.layers.Dense(16, activation="tanh")(h)
    model = keras.Model(x, keras.layers.Dense(16)(h))
    graph = graph_lib.Trace(model)
    nodes = graph_memory.TraceNodes(graph)
    assert [n.saved_outputs == tuple(g.out_keys) for n, g in zip(nodes, graph.nodes)] == [
        True,
        True,
        False,
    ]
    # Each reads its own input (the kernel's gradient), by its own key.
    assert [n.saved_args for n in nodes] == [tuple(g.arg_keys) for g in graph.nodes]

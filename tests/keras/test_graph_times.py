"""lingpipe.keras.graph_times and Plan's costs: each Keras layer call profiled (F, I, W,
B per micro-batch size), calls alike timed once, and Plan's choice between the profile
and FLOPs said on its screen, with bad input in one line."""

import keras
import pytest

import lingpipe.keras as lpk
from lingpipe import plan as plan_flags
from lingpipe.keras import graph as graph_lib
from lingpipe.keras import graph_times
from lingpipe.pipeline.planning import cell_times, planner

RATES = planner.Rates(flops_per_s=1e9, action_s=1e-5, bytes_per_s=1e12, latency_s=1e-7)


def _Model():
    """x [16] -> Dense(16, tanh) -> Dense(16, tanh) -> Dense(4): the first two calls alike."""
    x = keras.Input((16,))
    h = keras.layers.Dense(16, activation="tanh")(x)
    h = keras.layers.Dense(16, activation="tanh")(h)
    return keras.Model(x, keras.layers.Dense(4)(h), name="three_dense")


def test_calls_alike_are_timed_once_and_each_call_has_a_line_per_kind(monkeypatch):
    timed = []

    def Stub(run, weights, args, repeats, copies=4):
        rows = int(args[0].shape[0])
        timed.append((len(weights), rows))
        # F, I, W, B: 1 ms + 0.1 ms per row, and 2, 3, 4 times that.
        base = 1e-3 + 1e-4 * rows
        return (base, 2 * base, 3 * base, 4 * base), run(*args)

    monkeypatch.setattr(cell_times, "UnitSeconds", Stub)
    graph = graph_lib.Trace(_Model())
    times = graph_times.Profile(graph, sizes=(2, 8))
    # Two distinct calls (Dense 16 -> 16 with tanh, twice; Dense 16 -> 4), at two sizes.
    assert timed == [(2, 2), (2, 8), (2, 2), (2, 8)]
    assert times.source == "profile"
    for kind, lines in enumerate(
        (times.forward, times.backward_input, times.backward_weight, times.backward), start=1
    ):
        assert len(lines) == 3
        for fixed, per_example in lines:
            assert fixed == pytest.approx(kind * 1e-3) and per_example == pytest.approx(kind * 1e-4)


def test_plan_profiles_where_it_can_and_says_which_costs_it_used(monkeypatch):
    model = _Model()
    kwargs = dict(devices=2, memory_per_device="1GiB", batch_size=16, rates=RATES)
    profiled = lpk.Plan(model, num_micro_batches=[2, 4], costs="profile", **kwargs)
    assert profiled.costs_note == (
        "profiled per layer call here (F, I, W at micro-batches of 4 and 8)"
    )
    assert f"costs: {profiled.costs_note}" in str(profiled).splitlines()[0]
    assert profiled.chosen.step_seconds != lpk.Plan(model, costs="flops", **kwargs).step_seconds
    # Where the largest call cannot be profiled here, auto takes FLOPs and says why;
    # profile refuses in one line.
    monkeypatch.setattr(plan_flags, "DeviceBytes", lambda cap: (100, "this host's memory"))
    auto = lpk.Plan(model, **kwargs)
    assert auto.costs_note.startswith("FLOPs at the measured rate (profiling the largest")
    with pytest.raises(ValueError) as e:
        lpk.Plan(model, costs="profile", **kwargs)
    assert str(e.value).startswith(
        "lingpipe.keras.Plan: costs='profile': profiling the largest layer call of "
        "'three_dense' needs "
    )
    assert "\n" not in str(e.value)


def test_an_unknown_costs_source_is_one_line():
    with pytest.raises(ValueError) as e:
        lpk.Plan(_Model(), devices=2, memory_per_device="1GiB", batch_size=16, costs="fast")
    assert str(e.value) == (
        "lingpipe.keras.Plan: expected costs to be one of ('auto', 'profile', 'flops'), "
        "received 'fast'"
    )


def test_nothing_fits_is_said_before_any_layer_call_is_profiled(monkeypatch):
    def Profile(graph, sizes, repeats=5):
        raise AssertionError("profiled, though no candidate fits the cap")

    monkeypatch.setattr(graph_times, "Profile", Profile)
    with pytest.raises(ValueError, match=r"^lingpipe.keras.Plan: memory_per_device=.* no plan"):
        lpk.Plan(_Model(), devices=2, memory_per_device=256, batch_size=16, rates=RATES)

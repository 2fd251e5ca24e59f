"""asserts: ValueErrors that name the expression and its values."""

import pytest

from lingpipe import asserts


def test_eq_names_both_sides_and_the_layer():
    with pytest.raises(ValueError) as e:
        asserts.Eq(8, 6, "input_dims", "inputs.shape[-1]", where="model/fc")
    assert str(e.value) == (
        "model/fc: expected input_dims == inputs.shape[-1], received input_dims=8, "
        "inputs.shape[-1]=6"
    )


def test_comparisons_pass_and_fail():
    asserts.Eq(1, 1)
    asserts.Ne(1, 2)
    asserts.Gt(2, 1)
    asserts.Ge(1, 1)
    asserts.Lt(1, 2)
    asserts.Le(2, 2)
    with pytest.raises(ValueError, match="expected a > 2, received a=1"):
        asserts.Gt(1, 2)
    with pytest.raises(ValueError, match="expected k <= num_cells, received k=5, num_cells=3"):
        asserts.Le(5, 3, "k", "num_cells")


def test_positive_rejects_zero_negative_bool_and_float():
    asserts.Positive(3, "dims")
    for bad in (0, -1, True, 2.0, None):
        with pytest.raises(ValueError, match="expected dims to be a positive integer"):
            asserts.Positive(bad, "dims", where="fc")


def test_in_divisible_notnone_and_hint():
    asserts.In("SAME", ["SAME", "VALID"], "padding")
    with pytest.raises(
        ValueError,
        match=r"expected padding to be one of \['SAME', 'VALID'\], "
        r"received padding='same!'",
    ):
        asserts.In("same!", ["SAME", "VALID"], "padding")
    with pytest.raises(
        ValueError,
        match="pipeline: expected batch to be divisible by "
        "num_micro_batches, received batch=10, num_micro_batches=4; set "
        "micro_batch_size",
    ):
        asserts.DivisibleBy(
            10, 4, "batch", "num_micro_batches", where="pipeline", hint="set micro_batch_size"
        )
    with pytest.raises(ValueError, match="expected cls to be set, received cls=None"):
        asserts.NotNone(None, "cls")

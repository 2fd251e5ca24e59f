"""seeds: stateless seeds folded with step and micro-batch scopes."""

import numpy as np
import tensorflow as tf

from lingpipe import seeds


def _Seed():
    return seeds.StatelessSeed("model/drop", 1).numpy()


def test_same_scope_same_seed_and_scopes_change_it():
    base = _Seed()
    np.testing.assert_array_equal(base, _Seed())
    with seeds.StepSeedScope(3):
        step3 = _Seed()
        with seeds.StepSeedScope(0):
            mb0 = _Seed()
        with seeds.StepSeedScope(1):
            mb1 = _Seed()
    with seeds.StepSeedScope(3):
        np.testing.assert_array_equal(step3, _Seed())
    seen = {tuple(s) for s in (base, step3, mb0, mb1)}
    assert len(seen) == 4
    assert seeds.CurrentScopeValues() == ()


def test_path_and_random_seed_change_the_seed():
    assert not np.array_equal(_Seed(), seeds.StatelessSeed("model/drop2", 1).numpy())
    assert not np.array_equal(_Seed(), seeds.StatelessSeed("model/drop", 2).numpy())


def test_tensor_scope_values_and_restore_in_function():
    @tf.function
    def Fn(step):
        with seeds.StepSeedScope(step):
            saved = seeds.CurrentScopeValues()
            a = seeds.StatelessSeed("x", 0)
        with seeds.RestoreScopeValues(saved):
            b = seeds.StatelessSeed("x", 0)
        return a, b

    a, b = Fn(tf.constant(5))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    with seeds.StepSeedScope(5):
        np.testing.assert_array_equal(a.numpy(), seeds.StatelessSeed("x", 0).numpy())


def test_an_empty_scope_leaves_the_enclosing_values():
    with seeds.StepSeedScope(3):
        with seeds.StepSeedScope():
            assert seeds.CurrentScopeValues() == (3,)
        assert seeds.CurrentScopeValues() == (3,)
    assert seeds.CurrentScopeValues() == ()

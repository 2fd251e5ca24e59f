"""The TPU core annotation reads each stage's device from the schedule."""

import pytest
import tensorflow as tf

from lingpipe.pipeline import generators, placement

DEVICES = ["/device:CPU:0", "/device:CPU:1"]


def _Cores(sched):
    seen = []

    def Assign(tensor, core):
        seen.append(core)
        return tensor

    with placement.LogicalCores(Assign, DEVICES):
        annotators = placement.StageAnnotators(sched, DEVICES)
    for annotate in annotators:
        annotate(tf.constant(1.0))
    return seen


def test_v_placement_puts_the_first_and_last_stage_on_core_0():
    assert _Cores(generators.Make("zbv", 2, 4)) == [0, 1, 1, 0]
    assert _Cores(generators.Make("interleaved_1f1b", 2, 4, 2)) == [0, 1, 0, 1]


def test_stage_annotators_want_one_name_per_device():
    with pytest.raises(ValueError, match=r"runs on 2 devices, received 1 device names"):
        placement.StageAnnotators(generators.Make("zbv", 2, 4), DEVICES[:1])

"""remat.Kept: the (stage, micro-batch) pairs whose activations are kept, one policy for
every stage or one per stage."""

import pytest

from lingpipe.pipeline.schedules import generators
from lingpipe.pipeline.step import remat

POLICIES = ("always", "except_last", "never")


def _OfStage(pairs, stage):
    return {m for s, m in pairs if s == stage}


def test_one_policy_per_stage_keeps_what_each_stage_s_policy_says():
    sched = generators.Make("gpipe", 4, 4)
    kept = remat.Kept(sched, ["always", "except_last", "never", "always"])
    # 'except_last' under GPipe keeps the last micro-batch, 'never' every one.
    assert kept == {(1, 3)} | {(2, m) for m in range(4)}
    # 1F1B: stage 0's 'except_last' keeps micro-batch 0 (only forwards before its backward).
    sched = generators.Make("1f1b", 2, 4)
    assert remat.Kept(sched, ("except_last", "never")) == {(0, 0)} | {(1, m) for m in range(4)}


@pytest.mark.parametrize(
    "name,k,m",
    [("gpipe", 3, 4), ("1f1b", 3, 4), ("zero_bubble", 2, 4), ("zbv", 2, 4), ("dualpipev", 2, 4)],
)
def test_each_stage_keeps_what_its_policy_keeps_for_every_stage(name, k, m):
    sched = generators.Make(name, k, m)
    n = sched.num_stages  # 2K for the V-shaped schedules
    mix = [POLICIES[(s + 1) % 3] for s in range(n)]
    kept = remat.Kept(sched, mix)
    for s, policy in enumerate(mix):
        assert _OfStage(kept, s) == _OfStage(remat.Kept(sched, policy), s), (s, policy)
    # The same policy on every stage is that policy given once.
    for policy in POLICIES:
        assert remat.Kept(sched, [policy] * n) == remat.Kept(sched, policy)


def test_a_forward_only_schedule_keeps_nothing():
    sched = generators.Make("forward_only", 2, 4)
    assert remat.Kept(sched, ["never", "never"]) == set()


def test_per_stage_policies():
    assert remat.PerStage("never", 3) == ("never",) * 3
    assert remat.PerStage(["always", "never"], 2) == ("always", "never")
    assert remat.Text("always") == "always"
    assert remat.Text(("always", "never")) == "[always, never]"


@pytest.mark.parametrize(
    "given,shown",
    [
        (["always", "never"], "['always', 'never']"),  # one per stage of 4
        (["always", "never", "never", "sometimes"], "['always', 'never', 'never', 'sometimes']"),
        ("sometimes", "'sometimes'"),
        (None, "None"),
        ([None, "always", "always", "always"], "[None, 'always', 'always', 'always']"),
    ],
)
def test_a_wrong_length_or_unknown_policy_says_what_was_expected(given, shown):
    sched = generators.Make("1f1b", 4, 4)
    message = (
        "expected remat to be one of always, except_last, never or a list of them with one "
        f"per stage (4 stages), received remat={shown}"
    )
    with pytest.raises(ValueError) as e:
        remat.Kept(sched, given)
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        remat.PerStage(given, 4, where="pipe")
    assert str(e.value) == f"pipe: {message}"

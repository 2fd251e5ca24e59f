"""The planner's search over fixed costs: deterministic, never over the cap, refusals
that name their device and excess, and K=1 when pipelining is predicted to lose."""

from lingpipe.pipeline import planner

# Eight equal cells of 1 GFLOP per example, 1 MiB out, 4 MiB of weights each.
COSTS = planner.ModelCosts(flops=(1e9,) * 8, out_bytes=(2**20,) * 8, weight_bytes=(2**22,) * 8)
FAST_LINKS = planner.Rates(flops_per_s=1e12, action_s=1e-5, bytes_per_s=1e11, latency_s=1e-6)


def _Memory(c):
    """Weights of the device's cells, plus 1 MiB per example of a micro-batch per stage."""
    per_device = [0] * c.num_stages
    chunks = len(c.partition)
    micro = 32 // c.replicas // c.num_micro_batches
    for s, cells in enumerate(c.partition):
        d = s % c.num_stages if chunks == c.num_stages else min(s, chunks - 1 - s)
        per_device[d] += cells * 2**22 + micro * 2**20 * (1 if c.remat == "always" else 4)
    return per_device


def _Search(cap, rates=FAST_LINKS, devices=4):
    return planner.Search(COSTS, rates, devices, cap, 32, _Memory)


def test_the_search_is_deterministic_and_never_over_the_cap():
    first, second = _Search(48 * 2**20), _Search(48 * 2**20)
    assert first.chosen.Describe() == second.chosen.Describe()
    assert [c.Describe() for c in first.runners_up] == [c.Describe() for c in second.runners_up]
    for c in [first.chosen, *first.runners_up]:
        assert max(c.peak_bytes) <= 48 * 2**20, c.Describe()
    assert first.refused, "a cap of 48 MiB refuses some candidates"
    for r in first.refused:
        assert r.candidate.peak_bytes[r.device] == max(r.candidate.peak_bytes)
        assert r.excess_bytes == max(r.candidate.peak_bytes) - 48 * 2**20 > 0


def test_a_small_cap_forces_stages_and_a_large_one_allows_replicas():
    tight = _Search(20 * 2**20).chosen
    assert tight.num_stages > 1 and max(tight.peak_bytes) <= 20 * 2**20
    roomy = _Search(2**30).chosen
    assert roomy.replicas * roomy.num_stages == 4


def test_when_pipelining_loses_k_1_is_chosen():
    # Transfers between stages cost a second each: no pipeline is predicted fastest.
    slow_links = planner.Rates(flops_per_s=1e12, action_s=1e-5, bytes_per_s=1e3, latency_s=1.0)
    chosen = _Search(2**30, slow_links, devices=1).chosen
    assert chosen.num_stages == 1
    result = planner.Search(
        COSTS, slow_links, 2, 2**30, 32, _Memory, planner.Candidates(2, 8, 32, stages=(1, 2))
    )
    assert result.chosen.num_stages == 1 and result.chosen.replicas == 2


def test_the_flags_are_the_trainers():
    c = _Search(20 * 2**20).chosen
    flags = c.Flags()
    assert flags["num_stages"] == c.num_stages and flags["schedule"] == c.schedule
    assert f'remat : "{c.remat}"' in flags["params_override"]

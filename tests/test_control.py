import itertools

import pytest

from specdecode.decoding.control import (
    AdaptiveK,
    CostModel,
    FixedK,
    best_k,
    expected_tokens,
    predicted_speedup,
)
from specdecode.decoding.decoder import Step
from specdecode.engine.load import monotone

FREE = CostModel(0.0, {})  # r(k) = 1 and c = 0: the speedup is E(k) itself


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(0.7, 0) == 1.0
    for alpha, k in itertools.product([0.1, 0.5, 0.9], range(6)):
        assert predicted_speedup([alpha], FREE, k) == pytest.approx(expected_tokens(alpha, k))
    assert predicted_speedup([0.8, 0.5, 0.0], FREE, 3) == pytest.approx(1 + 0.8 + 0.4 + 0.0)


def test_verify_ratio_interpolates_and_extrapolates():
    cost = CostModel(0.0, {1: 1.1, 3: 1.3, 4: 1.5})
    assert cost.r(0) == 1.0 and cost.r(1) == 1.1 and cost.r(2) == pytest.approx(1.2)
    assert cost.r(6) == pytest.approx(1.9)  # slope of the last two points


@pytest.mark.parametrize(
    "alpha,c,slope", [(0.9, 0.0, 0.05), (0.6, 0.05, 0.1), (0.8, 0.2, 0.02), (0.3, 0.1, 0.2)]
)
def test_best_k_matches_brute_force(alpha, c, slope):
    cost = CostModel(c, {k: 1 + slope * k for k in range(1, 9)})
    k, speed = best_k([alpha], cost, 8)
    brute = max(range(9), key=lambda j: expected_tokens(alpha, j) / (j * c + 1 + slope * j) if j else 1.0)
    assert k == brute
    assert speed == pytest.approx(expected_tokens(alpha, k) / (k * c + 1 + slope * k) if k else 1.0)


def test_best_k_is_zero_when_speculation_loses():
    assert best_k([0.05], CostModel(0.1, {k: 1 + 0.3 * k for k in range(1, 9)}), 8)[0] == 0


def feed(policy, accept_prob_fn, steps):
    """Drive the policy with a scripted acceptance pattern; returns the k chosen at each step."""
    ks = []
    for t in range(steps):
        k = policy.next_k()
        ks.append(k)
        a = 0
        while a < k and accept_prob_fn(t, a):
            a += 1
        policy.observe(Step([0] * (a + 1), k, a, 0.0, 0.0))
    return ks


COST = CostModel(0.02, {k: 1 + 0.1 * k for k in range(1, 9)})


def test_adaptive_k_rises_with_acceptance_and_falls_back_when_it_drops():
    policy = AdaptiveK(COST, k_max=8, prior=[0.5])
    ks = feed(policy, lambda t, a: t < 60, 140)  # everything accepted for 60 steps, then nothing
    assert max(ks[40:60]) == 8 and ks[59] == 8
    plain_after = next(i for i in range(60, 140) if ks[i] == 0)
    assert plain_after - 60 < 20  # falls back quickly (decay 0.85: ~7 steps of memory)
    probes = [i for i in range(plain_after, 140) if ks[i] > 0]
    assert probes, "re-probes after a backoff"
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert all(g2 >= g1 for g1, g2 in zip(gaps, gaps[1:])) and gaps[-1] > gaps[0]  # backoff grows


def test_adaptive_k_recovers_when_acceptance_returns():
    policy = AdaptiveK(COST, k_max=6, prior=[0.5], min_backoff=4)
    ks = feed(policy, lambda t, a: t < 30 or t >= 60, 200)
    assert 0 in ks[30:60]
    assert ks[-1] > 0 and sum(k > 0 for k in ks[150:]) == 50  # back to speculating for good


def test_hysteresis_avoids_flapping_near_break_even():
    # acceptance right at the break-even of k=1: r(1)=1.1 plus c 0.02 needs E = 1 + a > 1.12
    policy = AdaptiveK(COST, k_max=1, prior=[0.12])
    ks = feed(policy, lambda t, a: (t % 25) < 3, 400)
    assert max(ks) == 1  # probes respect k_max
    switches = sum(1 for x, y in zip(ks, ks[1:]) if (x > 0) != (y > 0))
    assert switches < 60  # probes included; without hysteresis and backoff this flips every few steps


def test_k_zero_policy_still_decodes_in_the_loop(target):
    from specdecode.core.sampling import Warp
    from specdecode.decoding.decoder import decode
    from specdecode.drafters import NgramDrafter

    never = AdaptiveK(CostModel(1.0, {k: 2.0 for k in range(1, 5)}), k_max=4, prior=[0.0])
    steps = list(
        decode(
            target.model,
            NgramDrafter(),
            [5, 6, 7, 5, 6, 7, 5, 6],
            k=never,
            params=Warp(),
            max_new_tokens=12,
        )
    )
    assert sum(len(s.tokens) for s in steps) == 12
    assert steps[0].drafted == 0


def test_advise_prediction_accounts_for_steps_without_proposals():
    from specdecode.bench.advise import predicted_speedup
    from specdecode.core.metrics import Stats

    stats = Stats()
    for _ in range(10):
        stats.observe(drafted=0, accepted=0, committed=1)  # n-gram found nothing: a plain step
        stats.observe(drafted=4, accepted=2, committed=3)
    cost = CostModel(0.0, {n: 1 + 0.1 * n for n in range(1, 5)})
    assert predicted_speedup(stats, cost, 4) == pytest.approx(2 / (0.5 * 1 + 0.5 * 1.4))
    assert predicted_speedup(stats, cost, 2) == pytest.approx(2 / (0.5 * 1 + 0.5 * 1.2))
    assert predicted_speedup(stats, cost, 1) == pytest.approx(1.5 / (0.5 * 1 + 0.5 * 1.1))
    assert predicted_speedup(stats, cost, 0) == 1.0


def test_monotone_smoothing_is_the_least_squares_non_decreasing_fit():
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert monotone([1.3, 1.2, 1.4]) == pytest.approx([1.25, 1.25, 1.4])
    assert monotone([2.0, 1.0, 1.0, 3.0]) == pytest.approx([4 / 3] * 3 + [3.0])


def test_the_engines_measured_costs_grow_with_k(target, tiny_draft_dir):
    """The costs adaptive k, bench and advise price k with are the engine's: its target forwards at
    1..k+1 tokens (monotone, at least one step) and the draft model's time per drafted token in the
    engine's own steps."""
    from specdecode import drafters
    from specdecode import engine as eng
    from specdecode.core.sampling import Warp
    from specdecode.engine.client import alone, measuring_engine

    spec = drafters.parse(f"draft:{tiny_draft_dir}")
    engine = measuring_engine(target, drafters.DrafterContext(target), [spec], 6)
    assert engine.cost(spec, 6).draft_cost == 0.0  # nothing drafted yet: no drafting time known
    alone(engine, eng.Request(list(range(3, 40)), Warp(), 12, seed=0, drafter=spec, k=6, ignore_eos=True))
    cost = engine.cost(spec, 6)
    ratios = [cost.verify_ratio[k] for k in range(1, 7)]
    assert ratios == sorted(ratios) and ratios[0] >= 1.0
    assert cost.step_s > 0 and cost.draft_cost > 0


@pytest.mark.parametrize(
    "supply,accept", [([0.5, 0.8, 0.6], [0.7, 0.9, 0.5]), ([1.0], [0.6]), ([0.3, 1.0], [0.9])]
)
def test_supply_aware_speedup_matches_simulation(supply, accept):
    """Monte Carlo of a drafter that offers D tokens (continuing with prob s_i) of which a prefix is
    accepted (prob a_i each): mean committed tokens / mean step cost must equal the formula."""
    import random

    cost = CostModel(0.05, {k: 1 + 0.15 * k for k in range(1, 7)})
    rng, k, tokens, spent = random.Random(0), 5, 0.0, 0.0
    for _ in range(100_000):
        offered = 0
        while offered < k and rng.random() < supply[min(offered, len(supply) - 1)]:
            offered += 1
        accepted = 0
        while accepted < offered and rng.random() < accept[min(accepted, len(accept) - 1)]:
            accepted += 1
        tokens += accepted + 1
        spent += offered * cost.draft_cost + cost.r(offered)
    assert predicted_speedup(accept, cost, k, supply) == pytest.approx(tokens / spent, rel=0.01)


def test_low_supply_makes_a_large_k_worth_asking_for():
    """An n-gram-like drafter that rarely has long continuations: asking for many tokens costs
    little, so the best k is larger than for a drafter that always drafts k."""
    cost = CostModel(0.0, {k: 1 + 0.12 * k for k in range(1, 13)})
    accept = [0.6, 0.8, 0.85, 0.9]
    k_full, _ = best_k(accept, cost, 12)
    k_sparse, _ = best_k(accept, cost, 12, supply=[0.4, 0.6])
    assert k_sparse > k_full


def test_adaptive_k_learns_the_drafters_supply():
    policy = AdaptiveK(CostModel(0.0, {k: 1 + 0.12 * k for k in range(1, 13)}), k_max=12, prior=[0.8])
    for _ in range(30):  # asked for k, the drafter offered 2 tokens each time, both accepted
        k = policy.next_k()
        policy.observe(Step([0] * 3, min(2, k), min(2, k), 0.0, 0.0))
    supply = policy.supply()
    assert supply[0] > 0.95 and supply[1] > 0.95 and supply[2] < 0.2  # prior 1 weighs 1 of ~7.7


def test_tree_nodes_follow_the_cost_of_wider_verification_and_the_measured_calibration():
    confidence = [0.9, 0.8, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02]
    flat = AdaptiveK(CostModel(0.05, {n: 1.0 + 0.001 * n for n in range(1, 9)}), k_max=4)
    steep = AdaptiveK(CostModel(0.05, {n: 1.0 + 0.25 * n for n in range(1, 9)}), k_max=4)
    assert flat.tree_nodes(confidence) == 8  # every node adds more than its verification costs
    n = steep.tree_nodes(confidence)
    assert 1 <= n < 8
    brute = max(range(1, 9), key=lambda m: (1 + sum(confidence[:m])) / (0.05 + steep.cost.r(m)))
    assert n == brute  # the node count maximising E(n) / (drafting + r(n)), calibration 1 at the start
    for _ in range(30):  # the drafter is overconfident: its trees' paths are never accepted
        steep.tree_nodes(confidence)
        steep.observe(Step([0], drafted=n, accepted=0, draft_s=0.0, verify_s=0.0))
    assert steep.calibration() < 0.2 and steep.tree_nodes(confidence) < n
    assert FixedK(3).tree_nodes(confidence) == 8  # a fixed policy verifies what the drafter proposes

"""decoding/step_fit.py: a serving engine's cost model from its step times (Theil-Sen line), and the k it
leads to; monitor/step_costs.py: those step times read from vLLM's /metrics."""

from pathlib import Path

import pytest

from specdecode.decoding.control import best_k
from specdecode.decoding.step_fit import StepTiming, fit_step_costs
from specdecode.errors import UserError
from specdecode.monitor import prom, step_costs

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
ACCEPTANCE = [0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45]  # conditional a_i


def tokens_per_s(acceptance, base_s, per_token_s, k):
    """E(k) / T(k) written out: E(k) = 1 + Σ_i Π_{j<=i} a_j, T(k) = T0 + t·k."""
    expected, reach = 1.0, 1.0
    for a in acceptance[:k]:
        reach *= a
        expected += reach
    return expected / (base_s + per_token_s * k)


def noisy_timings(base_s, per_token_s, ks, slow_k=None):
    """Step times of the model with ±3% deterministic noise; the step at slow_k slowed 1.6x (a
    neighbour's burst on a shared machine)."""
    noise = [1.03, 0.97, 1.01, 0.98, 1.02, 0.99, 1.0, 1.03]
    return [
        StepTiming(k, (base_s + per_token_s * k) * noise[i] * (1.6 if k == slow_k else 1.0), 100)
        for i, k in enumerate(ks)
    ]


@pytest.mark.parametrize("per_token_s, expected_k", [(0.001, 6), (0.008, 3), (0.03, 1)])
def test_a_known_cost_model_recovers_its_optimal_k(per_token_s, expected_k):
    base_s = 0.05
    truth = [tokens_per_s(ACCEPTANCE, base_s, per_token_s, k) for k in range(9)]
    assert max(range(1, 7), key=lambda k: truth[k]) == expected_k  # the cases span the range of k
    fit = fit_step_costs(noisy_timings(base_s, per_token_s, range(1, 7), slow_k=3))
    assert fit.base_s == pytest.approx(base_s, rel=0.05)
    assert fit.per_token_s == pytest.approx(per_token_s, rel=0.15, abs=5e-4)
    k, speedup = best_k(ACCEPTANCE, fit.cost_model(), 6)
    assert k == expected_k
    assert speedup / fit.base_s == pytest.approx(truth[k], rel=0.05)  # tokens per second, predicted


def test_the_median_line_ignores_a_slowed_measurement_that_least_squares_follows():
    timings = noisy_timings(0.05, 0.008, range(1, 7), slow_k=6)
    fit = fit_step_costs(timings)
    assert fit.per_token_s == pytest.approx(0.008, rel=0.2)
    xs, ys = [t.draft_tokens for t in timings], [t.step_s for t in timings]  # negative control: OLS
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    ols = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert ols > 1.5 * 0.008
    assert best_k(ACCEPTANCE, fit.cost_model(), 6)[0] == 3


def test_two_draft_lengths_suffice_and_the_slope_never_goes_negative():
    fit = fit_step_costs([StepTiming(1, 0.06), StepTiming(6, 0.11)])
    assert (fit.base_s, fit.per_token_s) == pytest.approx((0.05, 0.01))
    assert fit.cost_model().draft_cost == pytest.approx(0.2) and fit.cost_model().r(6) == 1.0
    flat = fit_step_costs([StepTiming(1, 0.06), StepTiming(6, 0.05)])  # noise said longer drafts are faster
    assert flat.per_token_s == 0.0 and flat.base_s == pytest.approx(0.055)


@pytest.mark.parametrize(
    "timings, message",
    [
        ([StepTiming(4, 0.1), StepTiming(4, 0.12)], "two or more draft lengths"),
        ([], "two or more draft lengths"),
        ([StepTiming(1, 0.0), StepTiming(2, 0.1)], "positive step times"),
        ([StepTiming(1, 0.01), StepTiming(6, 0.2)], "inconsistent"),
    ],
)
def test_bad_timings_are_clear_errors(timings, message):
    with pytest.raises(UserError, match=message):
        fit_step_costs(timings)


def test_step_time_from_a_real_032_scrape():
    """385 decoding steps of one client at k = 6, 107.39 s of inter-token latency in all."""
    timing = step_costs.read(str(FIXTURES / "v032" / "eagle3_k6_scrape.txt"))
    assert timing.draft_tokens == pytest.approx(6.0) and timing.steps == 385
    assert timing.step_s == pytest.approx(107.39461593000124 / 385)


def scrape(drafts, draft_tokens, latency_s, steps) -> str:
    return (
        f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}\n'
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {draft_tokens}\n'
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} 0\n'
        f'vllm:inter_token_latency_seconds_sum{{engine="0"}} {latency_s}\n'
        f'vllm:inter_token_latency_seconds_count{{engine="0"}} {steps}\n'
    )


def test_a_measurement_is_the_increase_between_two_readings():
    before = step_costs.reading(prom.parse(scrape(10, 30, 2.0, 12)))
    after = step_costs.reading(prom.parse(scrape(110, 330, 9.0, 112)))
    timing = step_costs.timing(after, before)
    assert (timing.draft_tokens, timing.step_s, timing.steps) == pytest.approx((3.0, 0.07, 100))
    with pytest.raises(UserError, match="no decoding steps"):
        step_costs.timing(before, before)
    plain = step_costs.reading(
        prom.parse("vllm:inter_token_latency_seconds_sum 4\nvllm:inter_token_latency_seconds_count 100\n")
    )
    assert step_costs.timing(plain).draft_tokens == 0.0  # no speculation: a plain step

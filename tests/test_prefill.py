"""The prefill budget (decoding/prefill.py): how much prompt a step carries beside the others' decoding,
from a line through the live step timings. Timings here are synthetic, so every figure is exact."""

from __future__ import annotations

import pytest

from specdecode.decoding.prefill import (
    IDLE_PREFILL,
    MIN_PREFILL,
    SPAN_STEPS,
    PrefillBudget,
    chunk_cost,
    chunk_size,
    keys,
)


def timed(decode: tuple[float, float], prefill: tuple[float, float], chunk: int = 128) -> PrefillBudget:
    """A budget that has seen steps of (work, seconds) `decode` (decoding only) and `prefill`."""
    budget = PrefillBudget(chunk, ratio=2.0)
    for _ in range(3):
        budget.observe(decode[0], 0, decode[1])
        budget.observe(decode[0], prefill[0] - decode[0], prefill[1])
    return budget


def test_alone_a_prompt_gets_the_idle_budget_whatever_the_timings():
    assert PrefillBudget(128).work(0) == 128 * IDLE_PREFILL
    assert timed((40, 0.05), (140, 0.15)).work(0) == 128 * IDLE_PREFILL


def test_before_any_timing_a_step_may_add_as_much_work_as_it_decodes():
    budget = PrefillBudget(128, ratio=2.0)
    assert budget.work(40) == 40  # ratio 2: through the origin, t(80) = 2 t(40)
    assert budget.work(500) == 128  # never more than the chunk beside decoding rows
    assert budget.work(2) == MIN_PREFILL  # never less than MIN_PREFILL: the prompt advances


def test_the_step_with_its_chunk_is_predicted_at_twice_the_plain_decode_step():
    """Decode steps (40 units, 50 ms) and prefill steps (140 units, 150 ms): 10 ms fixed, 1 ms a unit.
    Beside 40 units of decoding the budget is 50 units: 10 + 90 = 2 x (10 + 40) ms."""
    budget = timed((40, 0.050), (140, 0.150))
    fixed, per_unit = budget.line()
    assert fixed == pytest.approx(0.010) and per_unit == pytest.approx(0.001)
    work = budget.work(40)
    assert work == pytest.approx(50)
    assert fixed + per_unit * (40 + work) == pytest.approx(2 * (fixed + per_unit * 40))


def test_the_budget_shrinks_when_prefill_work_is_dear_and_grows_with_the_batch():
    cheap = timed((40, 0.050), (140, 0.150))
    dear = timed((40, 0.050), (140, 0.550))  # a unit of work costs 5 ms: the decode step is 50 ms of it
    assert dear.work(40) < cheap.work(40)
    assert dear.work(40) == pytest.approx(MIN_PREFILL)  # 10 units, floored
    assert cheap.work(16) < cheap.work(40) < cheap.work(80)  # more decoding streams, more room beside


def test_a_line_that_says_work_is_free_is_not_believed():
    noisy = timed((40, 0.050), (140, 0.045))  # a slow decode phase on a shared machine
    assert noisy.line() == (0.0, 1.0) and noisy.work(40) == 40


@pytest.mark.parametrize("span", [3072.0, 256.0])
def test_deep_context_buys_fewer_tokens_with_the_same_budget(span):
    """The same step budget beside the same streams: a chunk deep into a 4k prompt has fewer tokens."""
    work = timed((40, 0.050), (140, 0.150)).work(40)
    sizes = [chunk_size(work, start, 10_000, span) for start in (0, 1000, 2000, 4000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
    for start, n in zip((0, 1000, 2000, 4000), sizes):
        assert chunk_cost(n, start, span) <= work


def plane(budget: PrefillBudget, steps, fixed=0.01, per_row=0.001, per_key=0.000002) -> None:
    """Feed steps (decode rows at a context, prompt rows at a depth) timed by an exact plane."""
    for (n, ctx), (m, depth) in steps:
        rows, k = n + m, keys(n, ctx) + keys(m, depth)
        work = chunk_cost(n, ctx, 3072.0), chunk_cost(m, depth, 3072.0) if m else 0.0
        budget.observe(*work, fixed + per_row * rows + per_key * k, rows, k)


def test_the_span_is_measured_from_the_steps_beside_decoding():
    """Forward time 10 ms + 1 ms a row + 2 us a cached key: 500 keys cost a row (FLOPs said 3,072)."""
    budget = PrefillBudget(128)
    assert budget.span(None) is None and budget.span(3072.0) == 3072.0  # nothing measured yet
    decode = [((8, 200 + i), (0, 0)) for i in range(SPAN_STEPS)]
    plane(budget, decode)
    assert budget.span(3072.0) == 3072.0  # decoding alone says nothing about keys vs rows
    plane(
        budget, [((8, 200), (m, depth)) for m, depth in zip([16, 9, 4, 3, 2, 2, 2, 2], range(0, 4000, 500))]
    )
    assert budget.span(3072.0) == pytest.approx(500.0)
    assert budget.span(None) is None  # a model without a span (rows only) keeps none
    assert budget.span(300.0) == 300.0  # never above the FLOP count's
    deep = [chunk_size(budget.work(40), 3500, 10_000, span) for span in (3072.0, budget.span(3072.0))]
    assert deep[1] < deep[0]  # the measured span buys a deep chunk fewer tokens


def test_a_plane_that_says_keys_are_free_is_not_believed():
    budget = PrefillBudget(128)
    plane(budget, [((8, 200), (m, 100 * m)) for m in range(2, 2 + 2 * SPAN_STEPS)], per_key=0.0)
    assert budget.span(3072.0) == 3072.0

"""Stats: acceptance rate α, mean acceptance length τ = 1 + accepted/drafts (vLLM's), by-position, merge."""

import pytest

from specdecode.core.metrics import Stats


def observed(steps, prefills=1):
    stats = Stats(prefills=prefills)
    for drafted, accepted in steps:
        stats.observe(drafted, accepted, accepted + 1)
    return stats


def test_alpha_tau_and_by_position():
    stats = observed([(4, 4), (4, 1), (4, 0), (2, 2)])
    assert (stats.drafted, stats.accepted, stats.steps, stats.new_tokens) == (14, 7, 4, 11)
    assert stats.acceptance_rate == pytest.approx(7 / 14)
    assert stats.mean_accepted_length == pytest.approx(1 + 7 / 4)
    assert stats.drafted_by_pos == [4, 4, 3, 3]
    assert stats.accepted_by_pos == [3, 2, 1, 1]
    # vLLM's per-position rate: accepted at position i over all drafts (not over drafts that reached i)
    assert stats.acceptance_by_position == pytest.approx([3 / 4, 2 / 4, 1 / 4, 1 / 4])
    assert stats.target_forwards == 5


def test_by_position_grows_with_the_longest_draft():
    stats = observed([(1, 1), (3, 2), (0, 0)])
    assert stats.drafted_by_pos == [2, 1, 1] and stats.accepted_by_pos == [2, 1, 0]
    assert stats.steps == 3 and stats.drafted == 4 and stats.accepted == 3


def test_tau_counts_drafts_not_steps_that_drafted_nothing():
    """vLLM's num_drafts counts steps that carried a draft; an n-gram step without a match is a
    plain step: it adds to steps (target forwards), not to drafts."""
    stats = observed([(3, 2), (0, 0), (0, 0), (2, 0)])
    assert (stats.steps, stats.drafts) == (4, 2)
    assert stats.mean_accepted_length == pytest.approx(1 + 2 / 2)
    assert stats.tokens_per_step == pytest.approx(1 + 2 / 4) == stats.new_tokens / stats.steps
    assert stats.acceptance_by_position == pytest.approx([1 / 2, 1 / 2, 0.0])
    assert stats.to_dict()["drafts"] == 2 and stats.merge(stats).drafts == 4


def test_plain_decoding_and_empty_stats():
    plain = observed([(0, 0)] * 5)
    assert plain.acceptance_rate == 0.0 and plain.mean_accepted_length == 1.0
    assert plain.acceptance_by_position == [] and plain.new_tokens == 5
    empty = Stats()
    assert (
        empty.acceptance_rate == empty.mean_accepted_length == empty.tokens_per_s == empty.mean_itl_s == 0.0
    )


def test_timing_properties():
    stats = observed([(2, 2), (2, 0)])  # 4 tokens
    stats.wall_s, stats.ttft_s = 2.0, 0.5
    stats.draft_s, stats.verify_s, stats.prefill_s = 0.3, 1.0, 0.2
    assert stats.tokens_per_s == pytest.approx(2.0)
    assert stats.mean_itl_s == pytest.approx(1.5 / 3)  # 3 gaps after the first token
    d = stats.to_dict()
    assert d["other_s"] == pytest.approx(0.5) and d["target_forwards"] == 3
    assert d["acceptance_rate"] == 0.5 and d["mean_accepted_length"] == 2.0
    assert d["acceptance_by_position"] == [0.5, 0.5]
    assert "α 0.50 (2/4)" in stats.summary() and "τ 2.00" in stats.summary()


def test_merge_adds_counts_and_pads_positions():
    a = observed([(4, 3), (4, 4)])
    a.wall_s, a.ttft_s = 1.0, 0.1
    b = observed([(2, 0)], prefills=1)
    b.wall_s, b.ttft_s = 0.5, 0.2
    m = a.merge(b)
    assert (m.drafted, m.accepted, m.steps, m.prefills, m.new_tokens) == (10, 7, 3, 2, 10)
    assert m.drafted_by_pos == [3, 3, 2, 2] and m.accepted_by_pos == [2, 2, 2, 1]
    assert m.wall_s == pytest.approx(1.5) and m.ttft_s == pytest.approx(0.3)
    assert m.acceptance_rate == pytest.approx(7 / 10) and m.mean_accepted_length == pytest.approx(1 + 7 / 3)
    # merging is symmetric and leaves its inputs alone
    assert b.merge(a).drafted_by_pos == m.drafted_by_pos
    assert a.drafted_by_pos == [2, 2, 2, 2] and b.drafted_by_pos == [1, 1]
    assert Stats().merge(a).to_dict() == a.to_dict()


def test_conditional_acceptance_counts_reached_positions():
    from specdecode.core.metrics import Stats

    s = Stats(prefills=1)
    s.observe(drafted=4, accepted=4, committed=5)  # reaches positions 1-4
    s.observe(drafted=4, accepted=1, committed=2)  # reaches 1-2 (2 rejected)
    s.observe(drafted=2, accepted=0, committed=1)  # reaches 1
    assert s.reached_by_pos == [3, 2, 1, 1]
    assert s.conditional_acceptance == [2 / 3, 1 / 2, 1.0, 1.0]

import pytest

from specdecode.metrics import Stats


def make():
    s = Stats(prefills=1)
    s.observe(drafted=4, accepted=4, committed=5)
    s.observe(drafted=4, accepted=1, committed=2)
    s.observe(drafted=2, accepted=0, committed=1)
    return s


def test_rates_follow_their_definitions():
    s = make()
    assert (s.drafted, s.accepted, s.steps, s.new_tokens) == (10, 5, 3, 8)
    assert s.acceptance_rate == pytest.approx(0.5)
    assert s.mean_accepted_length == pytest.approx(1 + 5 / 3)
    assert s.target_forwards == 4
    assert s.drafted_by_pos == [3, 3, 2, 2] and s.accepted_by_pos == [2, 1, 1, 1]
    assert s.acceptance_by_position == pytest.approx([2 / 3, 1 / 3, 0.5, 0.5])


def test_plain_decoding_stats():
    s = Stats(prefills=1)
    for _ in range(5):
        s.observe(0, 0, 1)
    assert s.acceptance_rate == 0 and s.mean_accepted_length == 1 and s.target_forwards == 6


def test_merge_adds_counts_and_aligns_positions():
    a, b = make(), Stats(prefills=1)
    b.observe(drafted=6, accepted=6, committed=7)
    m = a.merge(b)
    assert (m.drafted, m.accepted, m.steps, m.prefills) == (16, 11, 4, 2)
    assert m.drafted_by_pos == [4, 4, 3, 3, 1, 1] and m.accepted_by_pos == [3, 2, 2, 2, 1, 1]


def test_timings_and_dict():
    s = make()
    s.wall_s, s.ttft_s, s.draft_s, s.verify_s, s.prefill_s = 2.0, 0.3, 0.5, 1.0, 0.2
    d = s.to_dict()
    assert d["tokens_per_s"] == 4.0 and d["mean_itl_s"] == pytest.approx(1.7 / 7, abs=1e-5)
    assert d["other_s"] == pytest.approx(0.3)

"""warp / sample / next_token and Warp validation, on hand-built logits."""

import math

import pytest
import torch

from specdecode.core.sampling import BLOCK, Warp, argmax, next_token, sample, warp
from specdecode.errors import UserError


def logits_of(probs):
    return torch.tensor([math.log(p) for p in probs])


def assert_probs(actual, expected):
    expected = torch.tensor(expected, dtype=torch.float32)
    assert actual.dtype == torch.float32
    assert torch.allclose(actual, expected, atol=1e-6), (actual, expected)


def test_temperature_one_is_softmax_and_temperature_sharpens_or_flattens():
    logits = logits_of([1 / 7, 2 / 7, 4 / 7])
    assert_probs(warp(logits, Warp(temperature=1.0)), [1 / 7, 2 / 7, 4 / 7])
    # T = 0.5 squares the odds: 1 : 4 : 16
    assert_probs(warp(logits, Warp(temperature=0.5)), [1 / 21, 4 / 21, 16 / 21])
    # T = 2 takes their square roots: 1 : sqrt2 : 2
    s = 1 + math.sqrt(2) + 2
    assert_probs(warp(logits, Warp(temperature=2.0)), [1 / s, math.sqrt(2) / s, 2 / s])


def test_top_k_keeps_exactly_the_k_largest_and_renormalises():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0, -1.0])
    probs = warp(logits, Warp(temperature=1.0, top_k=2))
    e3, e2 = math.exp(3), math.exp(2)
    assert_probs(probs, [0, e3 / (e3 + e2), e2 / (e3 + e2), 0, 0])
    assert (probs[[0, 3, 4]] == 0).all()  # exactly zero, not merely small
    # top_k >= V is no filter
    assert_probs(warp(logits, Warp(temperature=1.0, top_k=5)), logits.softmax(-1).tolist())
    assert_probs(warp(logits, Warp(temperature=1.0, top_k=50)), logits.softmax(-1).tolist())
    # top_k = 1 is greedy
    assert_probs(warp(logits, Warp(temperature=1.0, top_k=1)), [0, 1, 0, 0, 0])


@pytest.mark.parametrize(
    "top_p,support",
    [
        (0.4, [1]),  # the top token alone already covers 0.4
        (0.75, [1, 3]),  # 0.5 < 0.75 -> 0.3 is needed, then 0.8 covers it
        (0.85, [1, 3, 0]),
        (0.99, [1, 3, 0, 2]),
        (1.0, [1, 3, 0, 2]),
    ],
)
def test_top_p_keeps_the_smallest_prefix_covering_p(top_p, support):
    probs_in = [0.15, 0.5, 0.05, 0.3]  # unsorted on purpose: ranks are 1, 3, 0, 2
    out = warp(logits_of(probs_in), Warp(temperature=1.0, top_p=top_p))
    kept = sum(probs_in[i] for i in support)
    expected = [probs_in[i] / kept if i in support else 0.0 for i in range(4)]
    assert_probs(out, expected)
    assert (out[[i for i in range(4) if i not in support]] == 0).all()


def test_top_p_applies_to_the_temperature_scaled_distribution():
    probs_in = [0.5, 0.3, 0.15, 0.05]
    scaled = [p**0.5 for p in probs_in]  # T = 2
    scaled = [s / sum(scaled) for s in scaled]  # 0.379, 0.294, 0.208, 0.120
    out = warp(logits_of(probs_in), Warp(temperature=2.0, top_p=0.7))
    kept = sum(scaled[:3])  # 0.379 + 0.294 = 0.673 < 0.7, so the third is kept too
    assert_probs(out, [scaled[0] / kept, scaled[1] / kept, scaled[2] / kept, 0.0])


def test_top_p_applies_after_top_k():
    # After top-k=2 the distribution is 4/7, 3/7: top-p 0.5 then keeps only the first token. (Applied
    # to the unfiltered distribution, top-p 0.5 would have kept two tokens.)
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert_probs(warp(logits, Warp(temperature=1.0, top_k=2, top_p=0.5)), [1, 0, 0, 0])
    assert_probs(warp(logits, Warp(temperature=1.0, top_k=3, top_p=0.6)), [4 / 7, 3 / 7, 0, 0])


def test_warp_works_row_wise_on_batches_and_returns_float32():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g).to(torch.bfloat16)
    params = Warp(temperature=0.8, top_k=5, top_p=0.9)
    out = warp(logits, params)
    assert out.shape == (2, 3, 11) and out.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            assert torch.allclose(out[i, j], warp(logits[i, j], params))
    assert torch.allclose(out.sum(-1), torch.ones(2, 3))
    assert ((out > 0).sum(-1) <= 5).all()


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [5.0, 0.0, 0.0, 4.0]])
    out = warp(logits, Warp())
    assert out.dtype == torch.float32
    assert out.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert Warp().greedy and not Warp(temperature=0.1).greedy
    # filters do not change greedy
    assert warp(logits, Warp(top_k=2, top_p=0.1)).tolist() == out.tolist()


def test_next_token_greedy_is_argmax_and_does_not_touch_the_generator():
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert next_token(torch.tensor([0.0, 3.0, 1.0]), Warp(), g) == 1
    assert torch.equal(g.get_state(), state)


def test_next_token_sampling_is_seeded_and_stays_in_the_support():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 1.5])
    params = Warp(temperature=1.0, top_k=3)
    draws_a = [next_token(logits, params, torch.Generator().manual_seed(7)) for _ in range(3)]
    g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    seq1 = [next_token(logits, params, g1) for _ in range(200)]
    seq2 = [next_token(logits, params, g2) for _ in range(200)]
    assert seq1 == seq2 and len(set(draws_a)) == 1
    assert set(seq1) == {0, 1, 4}  # top-3 support, each reached in 200 draws


def test_sample_never_draws_zero_probability_tokens():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3])
    draws = {sample(probs, g) for _ in range(300)}
    assert draws == {1, 3}
    assert sample(torch.tensor([0.0, 0.0, 1.0]), g) == 2


def test_sample_draws_each_token_in_proportion_across_blocks():
    # 2.5 blocks of the two-level inverse CDF; weights unnormalised, zeros inside and at both ends
    # of blocks, mass concentrated on a few tokens in different blocks and spread thin over others.
    n = 2 * BLOCK + BLOCK // 2
    w = torch.zeros(n)
    heavy = [3, BLOCK - 1, BLOCK, 2 * BLOCK + 7, n - 1]
    w[heavy] = torch.tensor([5.0, 3.0, 2.0, 4.0, 1.0])
    w[100:140] = 0.05  # 2.0 in all, 40 light tokens
    g = torch.Generator().manual_seed(3)
    draws = torch.tensor([sample(w, g) for _ in range(20000)])
    counts = torch.bincount(draws, minlength=n).double()
    assert counts[w == 0].sum() == 0
    expected = w.double() / w.sum() * len(draws)
    for t in heavy:  # within 5 standard deviations
        assert abs(counts[t] - expected[t]) < 5 * expected[t].sqrt(), (t, counts[t], expected[t])
    light = counts[100:140].sum()
    assert abs(light - expected[100:140].sum()) < 5 * expected[100:140].sum().sqrt()
    # the same generator state draws the same tokens
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert [sample(w, a) for _ in range(50)] == [sample(w, b) for _ in range(50)]


def test_sample_keeps_to_positive_weight_when_rounding_reaches_a_blocks_end():
    # a block whose only weight sits first, then zeros to the end: a uniform at the very top of the
    # block's range must still land on the positive token, never on a trailing zero.
    w = torch.zeros(2 * BLOCK)
    w[BLOCK] = 1e-30
    w[0] = 1.0
    g = torch.Generator().manual_seed(0)
    assert {sample(w, g) for _ in range(200)} <= {0, BLOCK}
    assert sample(torch.cat([torch.zeros(BLOCK + 5), torch.ones(1)]), g) == BLOCK + 5


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top-p"),
        ({"top_p": -0.5}, "top-p"),
        ({"top_p": 1.01}, "top-p"),
        ({"top_p": float("nan")}, "top-p"),
        ({"top_k": -1}, "top-k"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, message):
    with pytest.raises(UserError, match=message):
        Warp(**kwargs)


def test_sampling_params_accept_boundary_values():
    Warp(temperature=0.0, top_p=1.0, top_k=0)
    Warp(temperature=100.0, top_p=1e-9, top_k=1)


def test_argmax_is_torchs_with_ties_infinities_and_any_shape():
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (6, 1000), generator=g).float()  # many ties: the first of equals wins
    logits[2] = -math.inf
    logits[3, 500:] = math.inf
    for x in (logits, logits[1], logits.T.contiguous().T, logits.double()):
        got = argmax(x)
        assert got.dtype == torch.long and torch.equal(got, x.argmax(-1))
    assert argmax(logits.half()).tolist() == logits.argmax(-1).tolist()  # other dtypes: torch's own

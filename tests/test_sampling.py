import pytest
import torch

from specdecode.errors import UserError
from specdecode.sampling import SamplingParams, next_token, sample, warp

LOGITS = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))


def test_greedy_is_one_hot_argmax():
    probs = warp(LOGITS, SamplingParams())
    assert probs.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert next_token(LOGITS, SamplingParams(), None) == 0


def test_temperature_one_is_softmax_and_temperature_sharpens():
    p1 = warp(LOGITS, SamplingParams(temperature=1.0))
    assert torch.allclose(p1, torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]), atol=1e-6)
    p_half = warp(LOGITS, SamplingParams(temperature=0.5))
    expected = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert torch.allclose(p_half, expected / expected.sum(), atol=1e-6)


def test_top_k_keeps_k_largest_renormalised():
    p = warp(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7, atol=1e-6)


def test_top_p_keeps_smallest_prefix_reaching_p():
    # cumulative 0.5, 0.7, 0.85: top-p 0.7 keeps two tokens, 0.71 keeps three
    p = warp(LOGITS, SamplingParams(temperature=1.0, top_p=0.7))
    assert (p > 0).tolist() == [True, True, False, False, False]
    p = warp(LOGITS, SamplingParams(temperature=1.0, top_p=0.71))
    assert (p > 0).tolist() == [True, True, True, False, False]
    assert torch.allclose(p.sum(), torch.tensor(1.0))
    p = warp(LOGITS, SamplingParams(temperature=1.0, top_p=0.1))  # the top token always stays
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_warp_is_batched_per_row():
    rows = torch.stack([LOGITS, LOGITS.flip(0)])
    p = warp(rows, SamplingParams(temperature=1.0, top_k=1))
    assert p.argmax(-1).tolist() == [0, 4] and torch.allclose(p.sum(-1), torch.ones(2))


def test_sample_is_reproducible_with_generator():
    probs = warp(LOGITS, SamplingParams(temperature=1.0))
    a = [sample(probs, torch.Generator().manual_seed(7)) for _ in range(3)]
    g = torch.Generator().manual_seed(7)
    b = [sample(probs, g) for _ in range(50)]
    assert len(set(a)) == 1 and len(set(b)) > 1


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.01), dict(top_k=-1)])
def test_bad_params_rejected(kwargs):
    with pytest.raises(UserError):
        SamplingParams(**kwargs)

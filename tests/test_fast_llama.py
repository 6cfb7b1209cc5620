import pytest
import torch

from conftest import make_llama
from specdecode.backends import models
from specdecode.backends.fast_llama import FastLlama
from specdecode.errors import UserError


@pytest.fixture(scope="module")
def pair():
    hf = make_llama(seed=3, layers=2, hidden=64)
    return FastLlama(hf), models.HFModel(hf)


def test_logits_match_hf_through_extend_and_rollback(pair):
    fast, ref = pair
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 384, (300,), generator=g)
    fast.reset(), ref.reset()
    # prefill, multi-token extends that cross the cache's growth block, rollbacks, single tokens
    for chunk, keep in [(40, None), (5, 42), (1, None), (230, 250), (9, 251), (1, None)]:
        start = fast.length
        a = fast.extend(ids[start : start + chunk])
        b = ref.extend(ids[start : start + chunk])
        assert a.shape == b.shape == (chunk, 384)
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
        assert fast.length == ref.length
        if keep is not None:
            fast.truncate(keep), ref.truncate(keep)
    assert fast.k_cache.shape[3] > 256  # the cache grew past its first block on the way


def test_num_logits_keeps_last_rows(pair):
    fast, _ = pair
    fast.reset()
    ids = torch.arange(10, 30)
    full = fast.extend(ids)
    fast.reset()
    last = fast.extend(ids, num_logits=2)
    assert torch.allclose(last, full[-2:], atol=1e-5)


def test_context_overflow_is_an_error(pair):
    fast, _ = pair
    fast.reset()
    with pytest.raises(ValueError, match="exceeds max_length"):
        fast.extend(torch.zeros(fast.max_length + 1, dtype=torch.long))


def test_other_architectures_fall_back_to_hf():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert isinstance(models.wrap(gpt2, "auto"), models.HFModel)
    with pytest.raises(UserError, match="FastLlama does not support"):
        models.wrap(gpt2, "fast")
    with pytest.raises(UserError, match="unknown backend"):
        models.wrap(gpt2, "turbo")

import numpy as np
import pytest
import torch

from specdecode import drafters, models
from specdecode.drafters import DraftModelDrafter, NgramDrafter
from specdecode.drafters.ngram import lookup
from specdecode.errors import UserError
from specdecode.sampling import SamplingParams


def test_ngram_prefers_longest_then_most_recent_match():
    ctx = np.array([1, 2, 3, 9, 9, 2, 3, 7, 7, 5, 1, 2, 3])
    # last 3 tokens [1, 2, 3] occur at 0 -> continuation 9, 9, 2
    assert lookup(ctx, 3, max_n=3, min_n=1).tolist() == [9, 9, 2]
    # with n <= 2 the most recent [2, 3] (at 5) wins -> 7, 7
    assert lookup(ctx, 2, max_n=2, min_n=1).tolist() == [7, 7]
    # continuation shorter than k near the end of the context
    assert lookup(np.array([4, 5, 4]), 5, max_n=2, min_n=1).tolist() == [5, 4]
    assert lookup(np.array([1, 2, 3, 4]), 3, max_n=3, min_n=1).size == 0
    assert lookup(np.array([1, 2, 1, 3]), 3, max_n=3, min_n=2).size == 0  # 1-gram match is below min_n


def test_ngram_drafter_proposal_is_one_hot():
    p = NgramDrafter(max_n=2, min_n=1).propose([5, 6, 7, 5, 6], 3, SamplingParams(), None)
    assert p.tokens.tolist() == [7, 5, 6] and p.probs is None


@pytest.mark.parametrize("arg", ["0", "3-2", "x", "1-y"])
def test_ngram_bad_arguments(target, arg):
    with pytest.raises(UserError):
        drafters.build(f"ngram:{arg}", drafters.DrafterContext(target))


def test_ngram_argument_sets_range(target):
    d = drafters.build("ngram:1-3", drafters.DrafterContext(target))
    assert (d.min_n, d.max_n) == (1, 3)


def test_draft_model_cache_stays_in_sync(target, draft):
    """After partial acceptance the drafter's proposal equals a fresh drafter's on the same context."""
    vocab = target.model.vocab_size
    g = torch.Generator().manual_seed(0)
    context = torch.randint(2, vocab, (12,), generator=g).tolist()
    live = DraftModelDrafter(models.wrap(draft.model.hf), vocab)
    live.begin(context)
    for accepted in (2, 0, 4, 1):
        proposal = live.propose(context, 4, SamplingParams(), None).tokens.tolist()
        fresh = DraftModelDrafter(models.wrap(draft.model.hf), vocab)
        fresh.begin(context)
        assert fresh.propose(context, 4, SamplingParams(), None).tokens.tolist() == proposal
        context = context + proposal[:accepted] + [int(torch.randint(2, vocab, (1,), generator=g))]


def test_draft_model_probabilities_are_warped_distributions(target, draft):
    d = DraftModelDrafter(models.wrap(draft.model.hf), target.model.vocab_size)
    d.begin([5, 6, 7])
    p = d.propose([5, 6, 7], 3, SamplingParams(temperature=0.8, top_k=5), torch.Generator().manual_seed(0))
    assert p.probs.shape == (3, target.model.vocab_size)
    assert torch.allclose(p.probs.sum(-1), torch.ones(3))
    assert ((p.probs > 0).sum(-1) <= 5).all()
    assert all(p.probs[i, t] > 0 for i, t in enumerate(p.tokens.tolist()))


def test_build_errors(target, other_tokenizer_dir, tiny_draft_dir):
    ctx = drafters.DrafterContext(target)
    with pytest.raises(UserError, match="unknown drafter 'eagle9'"):
        drafters.build("eagle9", ctx)
    with pytest.raises(UserError, match="needs a model"):
        drafters.build("draft", ctx)
    with pytest.raises(UserError, match="model path not found"):
        drafters.build("draft:/no/where", ctx)
    with pytest.raises(UserError, match="does not share the target's tokenizer.*id \\d+"):
        drafters.build(f"draft:{other_tokenizer_dir}", ctx)
    assert isinstance(drafters.build(f"draft:{tiny_draft_dir}", ctx), DraftModelDrafter)

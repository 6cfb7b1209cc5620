import pytest
import torch

from conftest import TableModel, random_table
from specdecode import models
from specdecode.decoder import decode
from specdecode.drafters import DraftModelDrafter, NgramDrafter, NoDrafter, Proposal
from specdecode.sampling import SamplingParams, warp
from stats_util import tv, tv_bound

GREEDY = SamplingParams()


def prompts(n=10, vocab=384, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(3, 40, (1,), generator=g))
        ids = torch.randint(2, vocab, (length,), generator=g).tolist()
        if i % 3 == 0:  # repetitive prompts, so that n-gram lookup finds matches
            ids = (ids[:5] * 8)[:length]
        out.append(ids)
    return out


def run(target, drafter, prompt, k, params=GREEDY, max_new=24, eos=frozenset(), seed=0):
    g = torch.Generator().manual_seed(seed)
    steps = list(decode(target, drafter, prompt, k=k, params=params, max_new_tokens=max_new, eos_ids=eos, generator=g))
    return [t for s in steps for t in s.tokens], steps


def reference_greedy(hf, prompt, max_new):
    """Plain greedy by full recomputation, no cache at all."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_plain_decoding_matches_full_recompute(target, backend):
    model = models.wrap(target.model.hf, backend)
    for prompt in prompts(3):
        tokens, steps = run(model, NoDrafter(), prompt, k=4)
        assert tokens == reference_greedy(target.model.hf, prompt, 24)
        assert all(s.drafted == 0 and len(s.tokens) == 1 for s in steps)


def drafter_factories(target, draft):
    return {
        "ngram": lambda: NgramDrafter(),
        "ngram1": lambda: NgramDrafter(max_n=3, min_n=1),
        "draft": lambda: DraftModelDrafter(models.wrap(draft.model.hf), target.model.vocab_size),
        "self": lambda: DraftModelDrafter(models.wrap(target.model.hf), target.model.vocab_size),
    }


@pytest.mark.parametrize("name", ["ngram", "ngram1", "draft", "self"])
@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_greedy_speculation_is_token_identical(target, draft, name, backend):
    model = models.wrap(target.model.hf, backend)
    make = drafter_factories(target, draft)[name]
    total_drafted = 0
    for prompt in prompts(10 if backend == "fast" else 4):
        plain, _ = run(model, NoDrafter(), prompt, k=1)
        for k in (1, 2, 4, 8):
            tokens, steps = run(model, make(), prompt, k=k)
            assert tokens == plain, (name, k, prompt)
            total_drafted += sum(s.drafted for s in steps)
    assert total_drafted > 0  # the drafter really proposed something


def test_self_draft_accepts_everything(target):
    for params in (GREEDY, SamplingParams(temperature=1.0)):
        drafter = DraftModelDrafter(models.wrap(target.model.hf), target.model.vocab_size)
        for prompt in prompts(4):
            _, steps = run(target.model, drafter, prompt, k=4, params=params, max_new=30)
            assert sum(s.accepted for s in steps) == sum(s.drafted for s in steps) > 0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_max_new_tokens_and_step_bookkeeping(target, draft, k):
    for max_new in (1, 2, 7, 25):
        drafter = DraftModelDrafter(models.wrap(draft.model.hf), target.model.vocab_size)
        tokens, steps = run(target.model, drafter, prompts(1)[0], k=k, max_new=max_new)
        assert len(tokens) == max_new
        assert steps[-1].finished and not any(s.finished for s in steps[:-1])
        for s in steps:
            assert 0 <= s.accepted <= s.drafted <= k and len(s.tokens) == s.accepted + 1


def test_eos_stops_and_drops_tokens_after_it(target):
    prompt = prompts(1)[0]
    plain, _ = run(target.model, NoDrafter(), prompt, k=1, max_new=40)
    eos = plain[10]
    cut = plain[: plain.index(eos) + 1]
    for k in (1, 4, 8):
        self_draft = DraftModelDrafter(models.wrap(target.model.hf), target.model.vocab_size)
        tokens, steps = run(target.model, self_draft, prompt, k=k, max_new=40, eos={eos})
        assert tokens == cut and steps[-1].finished


class OneHotRandomDrafter:
    """Proposes uniformly random tokens without probabilities (like n-gram: one-hot q)."""

    name = "random"

    def __init__(self, vocab):
        self.vocab = vocab

    def begin(self, prompt):
        pass

    def propose(self, context, k, params, generator):
        return Proposal(torch.randint(0, self.vocab, (k,), generator=generator))

    def observe(self, drafted, accepted):
        pass


V = 8
SAMPLES = 20_000
SETTINGS = [
    ("draft", SamplingParams(temperature=1.0)),
    ("onehot", SamplingParams(temperature=0.7)),
    ("draft", SamplingParams(temperature=1.0, top_p=0.9)),
    ("draft", SamplingParams(temperature=1.0, top_k=3)),
]


@pytest.mark.parametrize("kind,params", SETTINGS, ids=[f"{k}-{p}" for k, p in SETTINGS])
def test_sampled_output_has_target_distribution(kind, params):
    """Joint distribution of the first two new tokens through the real loop equals the target's."""
    target_table, draft_table = random_table(V, seed=0), random_table(V, seed=1)
    target = TableModel(target_table)
    drafter = DraftModelDrafter(TableModel(draft_table), V) if kind == "draft" else OneHotRandomDrafter(V)
    prompt = [3, 5]
    p = warp(target_table, params)  # row t: distribution of the token after t
    exact = (p[prompt[-1]][:, None] * p).flatten()  # P(a, b) = p(a | 5) p(b | a)
    g = torch.Generator().manual_seed(1234)
    counts = torch.zeros(V * V)
    accepted = 0
    for _ in range(SAMPLES):
        steps = decode(target, drafter, prompt, k=2, params=params, max_new_tokens=2, generator=g)
        tokens, acc = [], 0
        for s in steps:
            tokens += s.tokens
            acc += s.accepted
        counts[tokens[0] * V + tokens[1]] += 1
        accepted += acc
    assert accepted > 0
    assert tv(counts, exact) < tv_bound(V * V, SAMPLES)


def test_statistical_check_catches_a_biased_loop():
    """Negative control at the loop level: greedy drafts accepted blindly skew the distribution."""
    params = SamplingParams(temperature=1.0)
    target_table = random_table(V, seed=0)
    p = warp(target_table, params)
    exact = (p[5][:, None] * p).flatten()
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(V * V)
    n = 5000
    for _ in range(n):
        a = int(torch.multinomial(p[5], 1, generator=g))
        b = int(target_table[a].argmax())  # the bug: second token taken greedily
        counts[a * V + b] += 1
    assert tv(counts, exact) > tv_bound(V * V, n)

"""Drafters: n-gram lookup, the draft-model drafter's cache sync and vocabulary alignment, and
drafters.build with its errors."""

import numpy as np
import pytest
import torch

from helpers import TableModel
from specdecode import drafters
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.models import HFModel
from specdecode.core.sampling import Warp
from specdecode.drafters import DrafterContext, DraftModelDrafter, NgramDrafter, NoDrafter
from specdecode.drafters.chain_stop import ChainStop
from specdecode.drafters.ngram import lookup
from specdecode.errors import UserError


def look(context, k, max_n=4, min_n=1):
    out = lookup(np.array(context, dtype=np.int64), k, max_n, min_n)
    assert out.dtype == np.int64
    return out.tolist()


def test_lookup_prefers_the_longest_ngram():
    # suffix [1, 2, 3]: the 3-gram matches at 0 (-> 9, 5, 2); the 2-gram [2, 3] matches later at 5 (-> 7)
    context = [1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3]
    assert look(context, 3, max_n=3) == [9, 5, 2]
    assert look(context, 3, max_n=2) == [7, 1, 2]


def test_lookup_uses_the_most_recent_match():
    assert look([4, 5, 6, 4, 5, 7, 4, 5], 2, max_n=2, min_n=2) == [7, 4]


def test_lookup_returns_at_most_k_and_stops_at_the_end_of_the_context():
    context = [1, 2, 8, 1, 2]
    assert look(context, 1) == [8]
    assert look(context, 2) == [8, 1]
    assert look(context, 10) == [8, 1, 2]  # only three tokens follow the match


def test_lookup_allows_a_match_overlapping_the_suffix():
    assert look([7, 7, 7], 4, max_n=2, min_n=2) == [7]


def test_lookup_respects_min_n_and_returns_empty_without_a_match():
    context = [5, 1, 2, 9, 3, 2]  # last bigram [3, 2] is new; the unigram [2] occurred at index 2
    assert look(context, 3, max_n=4, min_n=2) == []
    assert look(context, 3, max_n=4, min_n=1) == [9, 3, 2]
    assert look([1, 2, 3, 4], 3) == []
    assert look([1], 3) == []


def test_ngram_drafter_proposes_one_hot_tokens():
    proposal = NgramDrafter(max_n=3, min_n=2).propose([1, 2, 3, 4, 1, 2], 3, Warp(), None)
    assert proposal.tokens.dtype == torch.long and proposal.tokens.tolist() == [3, 4, 1]
    assert proposal.probs is None
    assert NgramDrafter().propose([1, 2, 3], 3, Warp(), None).tokens.numel() == 0


def test_ngram_stop_cuts_chains_by_this_requests_record():
    """`ngram:stop=P`: a chain's odds are the product of (kept + 1) / (reached + 2) per position, from
    this request's own verifications; rejected chains shorten the next ones, down to none, and a new
    request (begin) starts from the prior again."""
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]  # the bigram [1, 2] was followed by 3..8
    drafter = NgramDrafter(max_n=2, min_n=2, stop=0.2)
    drafter.begin(context)
    assert drafter.propose(context, 6, Warp(), None).tokens.tolist() == [3, 4]  # 0.5, 0.25, then 0.125
    for _ in range(3):
        drafter.observe(drafted=2, accepted=2)  # position 0: 3 of 3 kept; position 1: 3 of 3
    assert drafter.propose(context, 6, Warp(), None).tokens.tolist() == [3, 4, 5]  # 0.8 * 0.8 * 0.5
    for _ in range(8):
        drafter.observe(drafted=3, accepted=0)  # position 0: 3 of 11 kept, odds 4/13 then 4/13 * 4/5
    assert drafter.propose(context, 6, Warp(), None).tokens.tolist() == [3, 4]
    for _ in range(12):
        drafter.observe(drafted=2, accepted=0)  # position 0: 3 of 23 kept, 4/25 < 0.2
    assert drafter.propose(context, 6, Warp(), None).tokens.numel() == 0
    twin = drafter.fork()
    twin.begin(context)
    assert twin.propose(context, 6, Warp(), None).tokens.tolist() == [3, 4]
    assert drafter.propose(context, 6, Warp(), None).tokens.numel() == 0  # the fork's record is its own
    assert NgramDrafter(max_n=2, min_n=2).propose(context, 6, Warp(), None).tokens.numel() == 6  # no stop


def test_ngram_stop_auto_prices_rows_as_they_cost_now(monkeypatch):
    """`ngram:stop=auto` keeps a token while its odds pay its verification row: v measured at build
    (draft_model.chain_costs) without an engine's costs, else the engine's live r(n), read at each
    proposal (chain_stop.py)."""
    seen = []
    monkeypatch.setattr(drafters, "chain_costs", lambda draft, tgt: seen.append((draft, tgt)) or (0.0, 0.15))
    target = type("Loaded", (), {"model": object()})()
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]  # the prior's odds: 0.5, 0.25, 0.125, ...
    drafter = drafters.build("ngram:stop=auto", DrafterContext(target))
    assert drafter.stop.row == 0.15 and seen == [(None, target.model)]
    assert drafter.propose(context, 6, Warp(), None).tokens.tolist() == [3, 4]  # 0.125 < 0.15
    fixed = drafters.build("ngram:stop=30", DrafterContext(target)).stop
    assert fixed.fixed == 0.3 and fixed.bars(3) == ([0.3] * 3, [0.3] * 3) and len(seen) == 1
    ratios = [1.0, 1.2, 1.3]  # rows priced 0.2, 0.1, then 0.1 each (the last row's slope)
    live = drafters.build("ngram:stop=auto", DrafterContext(target, rows=lambda: ratios))
    assert live.propose(context, 6, Warp(), None).tokens.tolist() == [3, 4, 5]  # 0.5, 0.25, 0.125 >= 0.1
    ratios[1:] = [1.6, 2.2]  # a dearer phase: the first row now costs 0.6 of a step, more than 0.5
    assert live.propose(context, 6, Warp(), None).tokens.numel() == 0


@pytest.mark.parametrize(
    "text,error",
    [
        ("ngram:stop=100", "below 100"),
        ("ngram:b=2:stop=5", "needs a chain"),
        ("ngram:stop=x", "integer or auto"),
    ],
)
def test_ngram_stop_bad_values(text, error):
    with pytest.raises(UserError, match=error):
        drafters.parse(text)


@pytest.mark.parametrize("max_n,min_n", [(1, 2), (3, 0), (0, 0), (2, -1)])
def test_ngram_bad_range(max_n, min_n):
    with pytest.raises(UserError, match="min_n"):
        NgramDrafter(max_n=max_n, min_n=min_n)


def test_no_drafter_proposes_nothing():
    assert NoDrafter().propose([1, 2, 3], 4, Warp(), None).tokens.numel() == 0


# --- draft model drafter ----------------------------------------------------------------------------


def fresh_proposal(model_factory, vocab, context, k, params, seed):
    drafter = DraftModelDrafter(model_factory(), vocab)
    drafter.begin(context)
    return drafter.propose(context, k, params, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", ["fast", "hf"])
@pytest.mark.parametrize("params", [Warp(), Warp(temperature=0.9, top_k=20)], ids=["greedy", "sampled"])
def test_draft_model_cache_stays_in_sync(draft, backend, params):
    hf = draft.model.hf
    factory = (lambda: FastLlama(hf)) if backend == "fast" else (lambda: HFModel(hf))
    vocab = draft.model.vocab_size
    drafter = DraftModelDrafter(factory(), vocab)
    context = [11, 42, 7, 300, 5, 9, 77]
    drafter.begin(context)
    g = torch.Generator().manual_seed(0)
    first = drafter.propose(context, 4, params, g).tokens.tolist()
    assert len(first) == 4
    other = [t for t in range(20, 30) if t not in first]
    # What the decoder may commit after a step: partial acceptance + a recovered token, full acceptance
    # + a bonus token, immediate rejection, and then a context that diverges before the cache's end.
    contexts = [
        context + first[:2] + [other[0]],
        context + first[:2] + [other[0]] + [other[1]],  # (next step, previous drafts all rejected)
        context + first[:2] + [other[0], other[1]] + [other[2]],
        context[:3] + [other[3], other[4]],
        context[:3] + [other[3], other[4]] + [other[5]] * 3,
    ]
    for step, ctx in enumerate(contexts):
        seed = 100 + step
        got = drafter.propose(ctx, 3, params, torch.Generator().manual_seed(seed))
        ref = fresh_proposal(factory, vocab, ctx, 3, params, seed)
        assert got.tokens.tolist() == ref.tokens.tolist(), (step, ctx)
        if params.greedy:
            assert got.probs is None
        else:
            assert torch.allclose(got.probs, ref.probs, atol=1e-5)
        # the cache holds the context and all drafts but the last
        assert drafter.cached == ctx + got.tokens.tolist()[:-1]
        assert drafter.model.length == len(drafter.cached)
        # next step: keep one draft and add a fresh token
        drafter.propose(
            ctx + got.tokens.tolist()[:1] + [other[6]], 2, params, torch.Generator().manual_seed(1)
        )


def test_draft_model_probabilities_are_the_warped_draft_distribution():
    table = TableModel.random(8, seed=3)
    drafter = DraftModelDrafter(table, 8)
    params = Warp(temperature=0.8, top_p=0.9)
    drafter.begin([1])
    proposal = drafter.propose([1, 4], 3, params, torch.Generator().manual_seed(0))
    from specdecode.core.sampling import warp

    previous = [4] + proposal.tokens.tolist()[:-1]
    assert torch.allclose(proposal.probs, warp(table.table[previous], params))
    assert all(proposal.probs[i, t] > 0 for i, t in enumerate(proposal.tokens.tolist()))


def test_draft_vocabulary_is_aligned_to_the_target():
    # Draft vocabulary smaller than the target's: the missing ids get probability 0.
    small = TableModel.random(6, seed=4)
    drafter = DraftModelDrafter(small, 8)
    drafter.begin([0])
    proposal = drafter.propose([0, 1], 5, Warp(temperature=1.0), torch.Generator().manual_seed(0))
    assert proposal.probs.shape == (5, 8) and (proposal.probs[:, 6:] == 0).all()
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(5))
    # Draft vocabulary larger (padding rows): ids the target does not have are never proposed.
    table = torch.zeros(10, 10)
    table[:, 9] = 50.0  # the padding id 9 would win everywhere
    table[:, 3] = 5.0
    drafter = DraftModelDrafter(TableModel(table), 8)
    drafter.begin([0])
    assert drafter.propose([0, 1], 3, Warp(), None).tokens.tolist() == [3, 3, 3]


def chain_table() -> TableModel:
    """Token t is followed by t + 1 with probability CHAIN[t] (the rest spread evenly over the others)."""
    n = len(CHAIN) + 2
    p = torch.zeros(n, n)
    for t in range(n):
        top = CHAIN[t] if t < len(CHAIN) else 0.9
        p[t] = (1 - top) / (n - 1)
        p[t, (t + 1) % n] = top
    return TableModel(p.log())


CHAIN = [0.9, 0.9, 0.5, 0.9, 0.9, 0.9]  # from token 0: survival 0.9, 0.81, 0.405, 0.3645, 0.328, 0.295


@pytest.mark.parametrize(
    "stop,expected",
    [
        (0.0, [1, 2, 3, 4, 5, 6, 7]),
        (0.5, [1, 2]),
        (0.3, [1, 2, 3, 4, 5]),
        (0.95, []),
        (ChainStop(cost=0.2, row=0.3), [1, 2, 3]),  # keep while >= 0.3, draft on while >= 0.5
        (ChainStop(cost=0.5), [1, 2, 3]),  # rows measured free: a draft pass alone ends the chain
        (ChainStop(rows=lambda: [1.0, 1.1, 1.5, 2.0]), [1, 2]),  # rows 0.1, 0.4, 0.5: 0.405 < 0.5
    ],
)
def test_draft_chain_keeps_tokens_while_their_odds_pay_their_rows(stop, expected):
    drafter = DraftModelDrafter(chain_table(), len(CHAIN) + 2, stop=stop)
    drafter.begin([0])
    proposal = drafter.propose([5, 0], 7, Warp(), None)
    assert proposal.tokens.tolist() == expected
    extended = drafter.cached[2:]  # the draft model's cache: the context, then drafts it ran on
    assert drafter.cached[:2] == [5, 0] and extended == expected[: len(extended)]
    # the next step rolls back to the committed context whatever the last one drafted
    after = drafter.propose([5, 0, 1, 2, 3], 7, Warp(), None).tokens.tolist()
    assert drafter.cached[:5] == [5, 0, 1, 2, 3] and after[:1] == ([4] if stop != 0.95 else [])


def test_sampled_draft_chain_stops_on_the_drawn_tokens_probabilities():
    table = TableModel.random(8, seed=5, scale=2.0)
    params = Warp(temperature=1.0)
    lengths = []
    for seed in range(20):
        drafter = DraftModelDrafter(table, 8, stop=0.2)
        drafter.begin([1])
        proposal = drafter.propose([1], 6, params, torch.Generator().manual_seed(seed))
        tokens = proposal.tokens.tolist()
        lengths.append(len(tokens))
        if not tokens:  # the first token's expected odds were under 0.2: no q rows either
            assert proposal.probs is None
            continue
        drawn = proposal.probs[torch.arange(len(tokens)), proposal.tokens]
        before = torch.cat([torch.ones(1), torch.cumprod(drawn, 0)[:-1]])  # the chain's odds before each
        expected = proposal.probs.square().sum(-1)  # each token's odds as known before its draw
        assert (before * expected >= 0.2).all()  # every token kept pays its row, never judged on its own draw
        previous = [1] + tokens[:-1]
        assert torch.allclose(proposal.probs, torch.softmax(table.table[previous], -1))
    assert 0 < max(lengths) and min(lengths) < 6  # the stop cut some chains, not every one to nothing


@pytest.mark.parametrize("stop,depth", [(0.0, 4), (0.25, 3), (0.7, 1)])
def test_a_dynamic_tree_stops_growing_once_no_frontier_path_reaches_stop(stop, depth):
    from specdecode.drafters.growth import Growth

    root = torch.tensor([0.6, 0.3, 0.05, 0.05]).log()  # best paths: 0.6, then x 0.5 a level
    child = torch.tensor([0.5, 0.3, 0.1, 0.1]).log()
    calls = []

    def children(frontier):
        calls.append(frontier)
        return child.expand(len(frontier), -1)

    growth = Growth()
    tree, confidence = growth.dynamic(root, 4, 2, 100, children, stop)
    assert max(growth.depth) == depth and len(calls) == depth - 1  # one draft forward a level grown
    assert max(confidence) == pytest.approx(0.6)


def test_a_dynamic_tree_priced_by_rows_keeps_the_nodes_that_pay_and_grows_while_its_best_path_pays():
    from specdecode.drafters.chain_stop import ChainStop
    from specdecode.drafters.growth import Growth

    root = torch.tensor([0.6, 0.3, 0.05, 0.05]).log()
    child = torch.tensor([0.5, 0.3, 0.1, 0.1]).log()
    calls = []

    def children(frontier):
        calls.append(frontier)
        return child.expand(len(frontier), -1)

    # rows cost 0.1, 0.1, 0.2, 0.2, ... of a step; a level costs 0.05 more
    stop = ChainStop(cost=0.05, rows=lambda: [1.0, 1.1, 1.2, 1.4, 1.6])
    growth = Growth()
    tree, confidence = growth.dynamic(root, 4, 2, 100, children, stop)
    # level 1: 0.6 and 0.3 pay 0.1 each; level 2's best 0.3 pays the third row (0.2), 0.18 not the fourth;
    # level 3's best frontier path (0.15) does not pay a step and a row (0.25): two levels drafted
    assert len(calls) == 2 and max(growth.depth) == 3
    assert sorted(confidence, reverse=True) == pytest.approx([0.6, 0.3, 0.3])
    assert tree.parents.count(-1) == 2 and len(tree) == 3
    fixed = Growth()  # stop=P as a ChainStop: the frontier's bar alone, every node kept
    _, kept = fixed.dynamic(root, 4, 2, 100, children, ChainStop(fixed=0.25))
    assert max(fixed.depth) == 3 and len(kept) == len(fixed.tokens)
    dear = Growth()  # the first row costs more than the best token is worth: nothing drafted on
    calls.clear()
    tree, confidence = dear.dynamic(root, 4, 2, 100, children, ChainStop(rows=lambda: [1.0, 1.7]))
    assert not calls and not confidence and len(tree) == 0


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "dynamic-tree"])
def test_a_windowed_draft_reads_the_prompts_sink_and_tail_only(draft, tree):
    from specdecode.drafters.draft_lm import SINK
    from specdecode.drafters.draft_tree import DraftTreeDrafter

    hf, vocab, window = draft.model.hf, draft.model.vocab_size, 5

    def make(window):
        model = FastLlama(hf)
        if tree:
            return DraftTreeDrafter(model, vocab, 2, 6, window=window)
        return DraftModelDrafter(model, vocab, window=window)

    def fresh(context):  # an unwindowed drafter given only the tokens the window keeps
        whole = make(None)
        whole.begin(context)
        return whole.propose(context, 3, Warp(), None)

    short = list(range(30, 30 + SINK + window))  # no longer than sink + window: read whole
    windowed = make(window)
    windowed.begin(short)
    assert windowed.propose(short, 3, Warp(), None).tokens.tolist() == fresh(short).tokens.tolist()

    prompt = list(range(40, 60))
    windowed.begin(prompt)
    kept = prompt[:SINK] + prompt[-window:]
    first = windowed.propose(prompt, 3, Warp(), None)
    assert first.tokens.tolist() == fresh(kept).tokens.tolist()
    assert windowed.model.length <= len(kept) + 2  # the prefill read the window, not the prompt
    # later steps: drafts accepted in part, a recovered token, a rollback within the answer
    reply = first.tokens.tolist()[:1] + [7]
    for answer in (reply, reply + [9, 11], reply[:1] + [13]):
        got = windowed.propose(prompt + answer, 3, Warp(), None)
        assert got.tokens.tolist() == fresh(kept + answer).tokens.tolist(), answer


# --- drafters.build ---------------------------------------------------------------------------------


def test_build_known_drafters(target, tiny_draft_dir):
    ctx = DrafterContext(target, device="cpu")
    assert isinstance(drafters.build("none", ctx), NoDrafter)
    ngram = drafters.build("ngram", ctx)
    assert (ngram.min_n, ngram.max_n) == (2, 4)
    ngram = drafters.build("ngram:3", ctx)
    assert (ngram.min_n, ngram.max_n) == (3, 3)
    ngram = drafters.build("ngram:1-5", ctx)
    assert (ngram.min_n, ngram.max_n) == (1, 5)
    draft = drafters.build(f"draft:{tiny_draft_dir}", ctx)
    assert isinstance(draft, DraftModelDrafter) and draft.vocab_size == target.model.vocab_size


@pytest.mark.parametrize(
    "spec,message",
    [
        ("telepathy", "unknown drafter 'telepathy'"),
        ("telepathy:3", "unknown drafter 'telepathy:3'"),
        ("ngram:x", "ngram argument"),
        ("ngram:2-x", "ngram argument"),
        ("ngram:5-2", "min_n"),
        (
            "draft",
            "trained for target 'smollm2'|no draft checkpoint",
        ),  # the shipped one is for the default target
        ("draft:", "needs a model"),
        ("draft:/no/such/model/dir", "model path not found: /no/such/model/dir"),
        ("draft:window=0:/some/model", "window must be >= 1"),
        ("draft:window=x:/some/model", "window needs an integer"),
    ],
)
def test_build_errors(target, spec, message):
    with pytest.raises(UserError, match=message):
        drafters.build(spec, DrafterContext(target, device="cpu"))


def test_parse_is_the_one_validator():
    assert drafters.parse("ngram:2-3").kind == "ngram"
    with pytest.raises(
        UserError, match="known: none, ngram, draft, ensemble, fallback, medusa, eagle, suffix"
    ):
        drafters.parse("lookahead")


def test_build_drafts_across_vocabularies_for_a_model_with_another_tokenizer(target, other_tokenizer_dir):
    drafter = drafters.build(f"draft:{other_tokenizer_dir}", DrafterContext(target, device="cpu"))
    assert isinstance(drafter, drafters.CrossVocabDrafter)  # tested in test_cross_vocab.py

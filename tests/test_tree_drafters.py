"""Tree drafters (ngram branches, draft-model static and dynamic trees, ensembles) through the real
loop: greedy output is token-identical to plain greedy decoding, a draft equal to the target accepts
its whole best path, and bad specs give clear errors."""

import os

import numpy as np
import pytest

from specdecode import drafters
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.models import HFModel
from specdecode.core.sampling import Warp
from specdecode.decoding.generation import generate
from specdecode.drafters import (
    DrafterContext,
    DraftModelDrafter,
    DraftTreeDrafter,
    EnsembleDrafter,
    NgramDrafter,
)
from specdecode.drafters.ngram import lookup_all
from specdecode.errors import UserError
from test_decoder import MAX_NEW, MIN_MARGIN, full_recompute_greedy, make_prompts, perturbed_copy, run


def test_lookup_all_ranks_longer_matches_then_recent_ones():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    context = [1, 2, 3, 9, 5, 2, 3, 7, 4, 3, 8, 2, 3]
    found = [c.tolist() for c in lookup_all(np.array(context), 2, 3, 1, 5)]
    # 2-gram [2, 3] at 5 then 1 (most recent first), then 1-gram [3] at 9 (at 6 and 2: already found)
    assert found == [[7, 4], [9, 5], [8, 2]]
    assert [c.tolist() for c in lookup_all(np.array(context), 2, 3, 1, 2)] == [[7, 4], [9, 5]]
    # a continuation that is a prefix of one already found adds nothing and does not count
    assert [c.tolist() for c in lookup_all(np.array([5, 6, 7, 1, 5, 6, 7, 5]), 3, 1, 1, 3)] == [
        [6, 7, 5],
        [6, 7, 1],
    ]


def test_ngram_tree_proposal():
    proposal = NgramDrafter(max_n=1, min_n=1, branches=3).propose(
        [4, 1, 2, 4, 3, 4, 1, 5, 4], 2, Warp(), None
    )
    assert proposal.tokens.tolist() == [1, 5, 3, 4, 2] and proposal.parents == [-1, 0, -1, 2, 0]
    assert proposal.probs is None
    single = NgramDrafter(max_n=1, min_n=1, branches=3).propose([4, 1, 4], 2, Warp(), None)
    assert single.parents is None and single.tokens.tolist() == [1, 4]  # one continuation: a chain


@pytest.fixture(scope="module")
def cases(target):
    kept = []
    for prompt in make_prompts(count=10, seed=1):
        reference, margin = full_recompute_greedy(target.model.hf, prompt, MAX_NEW)
        if margin >= MIN_MARGIN:
            kept.append((prompt, reference))
    assert len(kept) >= 8
    return kept


def tree_drafter(name, target):
    """Tree drafters whose drafts the target partly accepts (draft models: the target with noise)."""
    hf, vocab = target.model.hf, target.model.vocab_size
    noisy = lambda: FastLlama(perturbed_copy(hf))  # noqa: E731
    return {
        "ngram-b3": lambda: NgramDrafter(min_n=1, branches=3),
        "static-b2": lambda: DraftTreeDrafter(noisy(), vocab, branches=2),
        "dynamic-b3": lambda: DraftTreeDrafter(noisy(), vocab, branches=3, nodes=10),
        "ensemble": lambda: EnsembleDrafter(
            [NgramDrafter(branches=2), DraftTreeDrafter(noisy(), vocab, 2, 6)]
        ),
    }[name]()


@pytest.mark.parametrize(
    "name,ks", [("ngram-b3", (2, 5)), ("static-b2", (3,)), ("dynamic-b3", (4,)), ("ensemble", (1, 4))]
)
def test_greedy_trees_are_token_identical_to_plain(target, cases, name, ks):
    drafter = tree_drafter(name, target)
    trees = accepted = 0
    for k in ks:
        for prompt, reference in cases:
            out, steps = run(target.model, drafter, prompt, k=k)
            assert out == reference, (name, k, prompt)
            trees += sum(s.drafted > s.depth for s in steps)
            accepted += sum(s.accepted for s in steps)
    assert trees > 0 and accepted > 0  # branches were verified, and some drafts were kept


@pytest.mark.parametrize("name", ["ngram-b3", "ensemble"])
def test_greedy_trees_with_the_hf_backend(target, target_hf, cases, name):
    drafter = tree_drafter(name, target)
    for prompt, reference in cases[:4]:
        assert run(target_hf.model, drafter, prompt, k=4)[0] == reference


def test_self_draft_trees_accept_the_whole_best_path(target, cases):
    hf, vocab = target.model.hf, target.model.vocab_size
    static = DraftTreeDrafter(FastLlama(hf), vocab, branches=3)
    ensemble = EnsembleDrafter([NgramDrafter(min_n=1, branches=2), DraftModelDrafter(FastLlama(hf), vocab)])
    dynamic = DraftTreeDrafter(HFModel(hf), vocab, branches=2, nodes=12)  # the HF tree forward drafting
    for drafter in (static, ensemble):
        for prompt, reference in cases[:4]:
            out, steps = run(target.model, drafter, prompt, k=4)
            assert out == reference
            assert all(s.accepted == s.depth == min(4, MAX_NEW - 1 - i * 5) for i, s in enumerate(steps))
    depth = accepted = 0
    for prompt, reference in cases[:4]:
        out, steps = run(target.model, dynamic, prompt, k=4)
        assert out == reference
        depth += sum(s.depth for s in steps)
        accepted += sum(s.accepted for s in steps)
    # the target's greedy path usually has the best cumulative probability, so it is usually kept
    assert accepted >= 0.8 * depth


def test_tree_stats_count_nodes_and_positions(target):
    prompt = [7, 8, 9, 7, 8, 10, 7, 8, 11, 7, 8]
    stats = generate(target, NgramDrafter(branches=3), prompt, k=3, max_new_tokens=12).stats
    assert stats.drafted > sum(stats.drafted_by_pos)  # nodes counted in α, depths by position
    assert len(stats.drafted_by_pos) <= 3 and stats.drafted_by_pos[0] >= 1
    assert stats.accepted == sum(stats.accepted_by_pos)


# --- specs ------------------------------------------------------------------------------------------


def test_build_tree_drafters(target, tiny_draft_dir, tmp_path):
    ctx = DrafterContext(target, device="cpu")
    ngram = drafters.build("ngram:1-3:b=3", ctx)
    assert (ngram.min_n, ngram.max_n, ngram.branches) == (1, 3, 3)
    assert drafters.build("ngram:b=2", ctx).branches == 2 and drafters.build("ngram", ctx).branches == 1
    static = drafters.build(f"draft:b=2:{tiny_draft_dir}", ctx)
    assert isinstance(static, DraftTreeDrafter) and (static.branches, static.nodes) == (2, None)
    colon = tmp_path / "draft:v1"  # a model path with ':' in it
    os.symlink(tiny_draft_dir, colon)
    dynamic = drafters.build(f"draft:b=3:nodes=12:{colon}", ctx)
    assert (dynamic.branches, dynamic.nodes) == (3, 12)
    assert type(drafters.build(f"draft:{colon}", ctx)) is DraftModelDrafter
    ensemble = drafters.build(f"ensemble:ngram:b=2+draft:b=2:nodes=6:{colon}+ngram:1", ctx)
    assert isinstance(ensemble, EnsembleDrafter)
    assert [type(m) for m in ensemble.members] == [NgramDrafter, DraftTreeDrafter, NgramDrafter]
    assert drafters.parse("ensemble:ngram+ngram:1").kind == "ensemble"


@pytest.mark.parametrize(
    "spec,message",
    [
        ("ngram:b=0", "ngram option b must be >= 1"),
        ("ngram:b=x", "ngram option b needs an integer"),
        ("ngram:depth=3", "unknown ngram option 'depth'; known: b"),
        ("ngram:2-4:3-5", "ngram argument must be N or MIN-MAX"),
        ("draft:b=2", "the draft drafter needs a model"),
        ("draft:nodes=8:/some/model", "nodes=N needs b=B"),
        ("draft:b=2:width=3:/some/model", "unknown draft option 'width'"),
        ("ensemble", "ensemble needs two or more drafters"),
        ("ensemble:ngram", "ensemble needs two or more drafters"),
        ("ensemble:ngram+", "ensemble needs two or more drafters"),
        ("ensemble:ngram+telepathy", "unknown drafter 'telepathy'"),
        ("ensemble:ngram+none", "ensemble members cannot be 'none'"),
        ("ensemble:ngram+ngram:b=0", "ngram option b must be >= 1"),
    ],
)
def test_bad_tree_specs(target, spec, message):
    with pytest.raises(UserError, match=message):
        drafters.build(spec, DrafterContext(target, device="cpu"))

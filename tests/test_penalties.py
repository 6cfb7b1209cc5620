"""Penalties as pure functions (OpenAI's presence/frequency, vLLM's repetition), and through the decoding
loop with speculation: greedy output equals penalized greedy decoding without drafts; sampled output
is distributed as the penalized target (with a negative control: the unpenalized target is rejected)."""

from __future__ import annotations

import pytest
import torch

from helpers import tv, tv_bound
from specdecode.core.plan import Plan
from specdecode.core.sampling import Warp, warp
from specdecode.core.tree import Tree
from specdecode.decoding.constraints import Constraints, row_prefixes
from specdecode.decoding.decoder import decode
from specdecode.decoding.penalties import Penalties, penalize, penalize_rows
from specdecode.drafters import DraftModelDrafter, NgramDrafter, NoDrafter
from specdecode.errors import UserError


def test_penalize_follows_the_openai_and_vllm_formulas():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    counts = torch.tensor([2.0, 1.0, 0.0, 0.0])
    seen = torch.tensor([True, True, False, True])  # token 3 is in the prompt only
    out = penalize(logits, counts, seen, Penalties(presence=0.5, frequency=0.25, repetition=2.0))
    # repetition first (seen: positive / r, negative * r), then - frequency * count - presence * [count > 0]
    assert out.tolist() == [2.0 / 2 - 0.5 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 3.0 / 2]
    assert penalize(logits, counts, seen, Penalties()).tolist() == logits.tolist()
    assert not Penalties().active and Penalties(frequency=-0.1).active


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"presence": 2.5}, "presence_penalty"),
        ({"frequency": -3}, "frequency_penalty"),
        ({"repetition": 0}, "repetition_penalty"),
    ],
)
def test_out_of_range_penalties_are_refused_by_name(kwargs, name):
    with pytest.raises(UserError, match=name):
        Penalties(**kwargs)


def test_each_row_counts_the_drafts_before_it():
    vocab, prompt, generated = 6, [5, 5], [1]
    logits = torch.zeros(3, vocab)
    pen = Penalties(frequency=1.0, repetition=2.0)
    out = penalize_rows(logits + 1.0, prompt, generated, [[], [2], [2, 2]], pen)
    for r, prefix in enumerate([[], [2], [2, 2]]):
        counts = torch.bincount(torch.tensor(generated + prefix), minlength=vocab).float()
        seen = counts > 0
        seen[5] = True
        assert torch.equal(out[r], penalize(torch.ones(vocab), counts, seen, pen)), r
    assert out[2, 2] == 0.5 - 2 and out[1, 2] == 0.5 - 1 and out[0, 2] == 1.0 and out[0, 5] == 0.5


def test_row_prefixes_of_a_chain_and_a_tree():
    chain = Plan(torch.tensor([9, 1, 2, 3]), None, None)
    assert row_prefixes(chain) == [[], [1], [1, 2], [1, 2, 3]]
    tree = Tree([1, 4, 2, 5], [-1, -1, 0, 2])
    planned = Plan(torch.tensor([9] + tree.tokens), tree, None)
    assert row_prefixes(planned) == [[], [1], [4], [1, 2], [1, 2, 5]]


def _tokens(model, drafter, prompt, k, params, constraints, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    steps = decode(
        model, drafter, prompt, k=k, params=params, max_new_tokens=n, generator=g, constraints=constraints
    )
    return [t for s in steps for t in s.tokens]


PENALTIES = [Penalties(frequency=1.5), Penalties(presence=1.0, repetition=1.3), Penalties(presence=-0.5)]


@pytest.mark.parametrize("pen", PENALTIES, ids=str)
@pytest.mark.parametrize(
    "drafter", [NgramDrafter(min_n=1), NgramDrafter(min_n=1, branches=3)], ids=["chain", "tree"]
)
def test_greedy_with_penalties_and_speculation_equals_penalized_greedy(target, pen, drafter):
    model, changed = target.model, 0
    for prompt in ([5, 6, 7, 5, 6, 7, 5, 6], [40, 41, 42, 43, 40, 41]):
        plain = _tokens(model, NoDrafter(), prompt, 0, Warp(), Constraints(prompt, pen), 24)
        spec = _tokens(model, drafter, prompt, 4, Warp(), Constraints(prompt, pen), 24)
        assert spec == plain, prompt
        changed += _tokens(model, NoDrafter(), prompt, 0, Warp(), None, 24) != plain
    assert changed  # the penalty changes some output: the comparison above can fail


# --- the sampled distribution: TableModels on V = 8, first two new tokens (as test_decoder) ---------
N = 6000
PEN = Penalties(presence=0.7, frequency=0.8, repetition=1.6)


def penalized_joint(table, prompt, params, pen):
    """Exact P(first, second) of a TableModel target under penalties: the first token's row is
    penalized by the prompt (repetition) only, the second's also by the first token."""
    vocab = table.shape[0]
    rows = penalize_rows(table[[prompt[-1]] * 1], prompt, [], [[]], pen)
    p1 = warp(rows[0], params).double()
    second = penalize_rows(table, prompt, [], [[a] for a in range(vocab)], pen)  # [V, V] row a: after a
    p2 = warp(second, params).double()
    return p1[:, None] * p2


def first_two(target, drafter, prompt, params, pen, n):
    vocab = target.vocab_size
    counts = torch.zeros(vocab * vocab)
    drafted = accepted = 0
    for seed in range(n):
        g = torch.Generator().manual_seed(seed)
        out = []
        for step in decode(
            target,
            drafter,
            prompt,
            k=2,
            params=params,
            max_new_tokens=3,
            generator=g,
            constraints=Constraints(prompt, pen),
        ):
            out += step.tokens
            drafted, accepted = drafted + step.drafted, accepted + step.accepted
            if len(out) >= 2:
                break
        counts[out[0] * vocab + out[1]] += 1
    return counts.view(vocab, vocab), drafted, accepted


def test_sampled_tokens_follow_the_penalized_distribution(tables):
    target, draft_model = tables
    prompt, params = [3, 2], Warp(temperature=1.0)
    counts, drafted, accepted = first_two(
        target, DraftModelDrafter(draft_model, target.vocab_size), prompt, params, PEN, N
    )
    assert drafted >= 2 * N and 0.05 * drafted < accepted < 0.95 * drafted  # acceptance and rejection
    exact = penalized_joint(target.table, prompt, params, PEN)
    bound = tv_bound(64, N)  # Weissman et al. 2003 (helpers.tv_bound): 0.078 for 64 cells, 6k draws
    assert tv(counts, exact) < bound
    # negative control: the same counts are far from the unpenalized target's joint
    plain = penalized_joint(target.table, prompt, params, Penalties())
    assert tv(counts, plain) > bound

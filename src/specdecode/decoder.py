"""The speculative decoding loop, top to bottom.

Invariant: the target's KV cache holds every committed token except the last one, which is fed
together with the drafts at the next step. One step therefore is:

  1. the drafter proposes up to k tokens d_1..d_k after the committed context;
  2. the target runs once on [last committed, d_1..d_k] -> k+1 next-token distributions;
  3. verification accepts a prefix d_1..d_a and adds one target token (recovered or bonus);
  4. the target's cache is cut back to drop the rejected drafts (a crop, no recomputation).

With the `none` drafter k is 0 and the same loop is plain autoregressive decoding. A drafter may
propose a token tree instead of a chain (Proposal.parents): the target then checks every branch in
the same single forward (a tree attention mask), the longest accepted path is committed, and its
keys and values are moved together in the cache (`keep`); k bounds the tree's depth.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specdecode.control import FixedK, KPolicy
from specdecode.drafters.base import Drafter
from specdecode.errors import UserError
from specdecode.models import CausalLM
from specdecode.sampling import SamplingParams, warp
from specdecode.tree_verify import verify_tree_greedy, verify_tree_rejection
from specdecode.verify import verify_greedy, verify_rejection


@dataclass
class Step:
    tokens: list[int]  # tokens committed by this step (accepted drafts + one target token)
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    draft_s: float  # time spent in the drafter
    verify_s: float  # time spent in the target forward and verification
    prefill_s: float = 0.0  # first step only: the prompt's prefill
    finished: bool = False  # EOS or max_new_tokens reached
    depth: int | None = None  # draft positions checked: = drafted for a chain, a tree's depth (None: unknown)


@dataclass
class _Checked:
    accepted: list[int]  # the accepted draft tokens, in order
    next_token: int  # recovered or bonus token
    drafted: int  # draft tokens (tree nodes) the target checked
    depth: int  # longest draft path


def _check_chain(target, last, proposal, budget, params, generator) -> _Checked:
    """One target forward over [last, d_1..d_k], verification, rollback of the rejected drafts."""
    draft = proposal.tokens[:budget] if proposal is not None else torch.empty(0, dtype=torch.long)
    base = target.length
    logits = target.extend(torch.cat([torch.tensor([last]), draft]))  # [k+1, V]
    if params.greedy:
        verdict = verify_greedy(draft.to(logits.device), logits)
    else:
        q = proposal.probs[: len(draft)] if proposal is not None and proposal.probs is not None else None
        verdict = verify_rejection(draft.to(logits.device), q, warp(logits, params), generator)
    target.truncate(base + 1 + verdict.accepted)
    k = len(draft)
    return _Checked(draft[: verdict.accepted].tolist(), verdict.next_token, k, k)


def _check_tree(target, last, proposal, budget, params, generator) -> _Checked:
    """One target forward over [last, tree nodes] with the tree's mask and positions; the accepted
    path's keys and values are then moved to contiguous positions after `last` (keep)."""
    if not hasattr(target, "extend_tree"):
        raise UserError(f"token trees need a target model that can verify them; {type(target).__name__} cannot")
    tree = proposal.tree()
    nodes = tree.up_to_depth(budget)  # a step commits at most budget + 1 tokens
    probs = proposal.probs
    if len(nodes) < len(tree):
        tree = tree.subset(nodes)
        probs = probs[nodes] if probs is not None else None
    base = target.length
    tokens = torch.tensor([last] + tree.tokens, dtype=torch.long)
    logits = target.extend_tree(tokens, tree.positions(base), tree.mask())  # [N+1, V], +1 layout
    if params.greedy:
        verdict = verify_tree_greedy(tree, logits)
    else:
        verdict = verify_tree_rejection(tree, probs, warp(logits, params), generator)
    target.keep(base + 1, [base + 1 + i for i in verdict.path])
    return _Checked([tree.tokens[i] for i in verdict.path], verdict.next_token, len(tree), tree.max_depth)


def decode(
    target: CausalLM,
    drafter: Drafter,
    prompt: list[int],
    *,
    k: int | KPolicy,
    params: SamplingParams,
    max_new_tokens: int,
    eos_ids: set[int] = frozenset(),
    generator: torch.Generator | None = None,
) -> Iterator[Step]:
    """Generate up to max_new_tokens after prompt, yielding one Step per target forward.
    k: a fixed number of drafts per step, or a policy asked before each step (adaptive k)."""
    policy = FixedK(k) if isinstance(k, int) else k
    t0 = time.perf_counter()
    target.reset()
    drafter.begin(prompt)
    if len(prompt) > 1:
        target.extend(torch.tensor(prompt[:-1], dtype=torch.long), num_logits=1)
    prefill_s = time.perf_counter() - t0
    context = list(prompt)
    generated = 0
    while generated < max_new_tokens:
        t0 = time.perf_counter()
        budget = min(policy.next_k(), max_new_tokens - generated - 1)  # a step commits <= budget + 1
        proposal = drafter.propose(context, budget, params, generator) if budget > 0 else None
        t1 = time.perf_counter()

        if proposal is not None and proposal.parents is not None:
            checked = _check_tree(target, context[-1], proposal, budget, params, generator)
        else:
            checked = _check_chain(target, context[-1], proposal, budget, params, generator)
        drafter.observe(checked.drafted, len(checked.accepted))

        new = checked.accepted + [checked.next_token]
        for i, token in enumerate(new):
            if token in eos_ids:
                new = new[: i + 1]
                break
        context.extend(new)
        generated += len(new)
        finished = generated >= max_new_tokens or new[-1] in eos_ids
        step = Step(new, checked.drafted, len(checked.accepted), t1 - t0, time.perf_counter() - t1, prefill_s,
                    finished, checked.depth)
        policy.observe(step)
        yield step
        prefill_s = 0.0
        if finished:
            return

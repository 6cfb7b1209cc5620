"""The speculative decoding loop, top to bottom.

Invariant: the target's KV cache holds every committed token except the last one, which is fed
together with the drafts at the next step. One step therefore is:

  1. the drafter proposes up to k tokens d_1..d_k after the committed context;
  2. the target runs once on [last committed, d_1..d_k] -> k+1 next-token distributions;
  3. verification accepts a prefix d_1..d_a and adds one target token (recovered or bonus);
  4. the target's cache is cut back to drop the rejected drafts (a crop, no recomputation).

With the `none` drafter k is 0 and the same loop is plain autoregressive decoding.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specdecode.control import FixedK, KPolicy
from specdecode.drafters.base import Drafter
from specdecode.models import CausalLM
from specdecode.sampling import SamplingParams, warp
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
        draft = proposal.tokens[:budget] if proposal is not None else torch.empty(0, dtype=torch.long)
        t1 = time.perf_counter()

        base = target.length
        logits = target.extend(torch.cat([torch.tensor(context[-1:]), draft]))  # [n+1, V]
        if params.greedy:
            verdict = verify_greedy(draft.to(logits.device), logits)
        else:
            q = proposal.probs[: len(draft)] if proposal is not None and proposal.probs is not None else None
            verdict = verify_rejection(draft.to(logits.device), q, warp(logits, params), generator)
        target.truncate(base + 1 + verdict.accepted)
        drafter.observe(len(draft), verdict.accepted)

        new = draft[: verdict.accepted].tolist() + [verdict.next_token]
        for i, token in enumerate(new):
            if token in eos_ids:
                new = new[: i + 1]
                break
        context.extend(new)
        generated += len(new)
        finished = generated >= max_new_tokens or new[-1] in eos_ids
        step = Step(new, len(draft), verdict.accepted, t1 - t0, time.perf_counter() - t1, prefill_s, finished)
        policy.observe(step)
        yield step
        prefill_s = 0.0
        if finished:
            return

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

A drafter that reads the target's hidden states (Medusa, EAGLE) names the layers it needs
(`layers`); the target's forward returns those rows with the logits, and the decoder feeds the
drafter the rows that stay in the cache (`feed`): the prompt's after prefill, then after each step
the root's and the accepted drafts'. The step's pieces (plan, check, commit) live in step.py,
shared with the batched core (batch_decoder.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from specdecode.backends.lm import CausalLM
from specdecode.core.drafter import Drafter
from specdecode.core.plan import plan
from specdecode.core.sampling import Warp
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.control import FixedK, KPolicy
from specdecode.decoding.step import Decoding, Step, settle

__all__ = ["Step", "decode"]


def decode(
    target: CausalLM,
    drafter: Drafter,
    prompt: list[int],
    *,
    k: int | KPolicy,
    params: Warp,
    max_new_tokens: int,
    eos_ids: set[int] = frozenset(),
    generator: torch.Generator | None = None,
    constraints: Constraints | None = None,
    logprobs: int | None = None,
) -> Iterator[Step]:
    """Generate up to max_new_tokens after prompt, yielding one Step per target forward.
    k: a fixed number of drafts per step, or a policy asked before each step (adaptive k).
    constraints: penalties and a grammar on the target's distribution (constraints.py); logprobs:
    each Step carries its tokens' target logprobs with this many top ones (logprobs.py)."""
    policy = FixedK(k) if isinstance(k, int) else k
    layers = drafter.layers  # target layers whose hidden rows the drafter reads
    t0 = time.perf_counter()
    target.reset()
    drafter.begin(prompt)
    if len(prompt) > 1:
        out = target.forward(torch.tensor(prompt[:-1], dtype=torch.long), num_logits=1, layers=layers)
        if layers:
            drafter.feed(out.features)
    prefill_s = time.perf_counter() - t0
    context = list(prompt)
    seq = Decoding(
        target,
        drafter,
        policy,
        params,
        generator,
        eos_ids,
        constraints=constraints,
        context=context,
        logprobs=logprobs,
    )
    generated = 0
    while generated < max_new_tokens:
        t0 = time.perf_counter()
        budget = min(policy.next_k(), max_new_tokens - generated - 1)  # a step commits <= budget + 1
        proposal = drafter.propose(context, budget, params, generator) if budget > 0 else None
        t1 = time.perf_counter()

        planned = plan(context[-1], proposal, budget, policy.tree_nodes)
        if constraints is not None:
            planned = constraints.cut(planned)
        base = target.length
        out = target.forward(planned.tokens, layers=layers, **planned.tree_args(base))  # logits [1+n, V]
        step = settle(
            planned,
            out,
            base,
            seq,
            room=max_new_tokens - generated,
            draft_s=t1 - t0,
            verify_s=lambda t1=t1: time.perf_counter() - t1,
            prefill_s=prefill_s,
        )
        context.extend(step.tokens)
        generated += len(step.tokens)
        yield step
        prefill_s = 0.0
        if step.finished:
            return

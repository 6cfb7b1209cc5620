"""One speculative step for one sequence, in pieces shared by the single-sequence loop (decoder.py)
and the batched core (batch_decoder.py), so that both make exactly the same decisions:

  plan(last, proposal, budget, nodes) -> Plan what the target checks: [last, drafts], a chain or a
                                              token tree, cut to the step's budget (and a ranked
                                              tree to the node count its policy chooses; core/plan.py);
  (the caller runs the target on plan.tokens: alone, or as one row of a batched forward)
  check(plan, logits, params, generator)     greedy or rejection verification, chain or tree
      -> Checked                              (core/verify.py, tree_verify.py);
  cache rollback                              keep the root and the accepted path: plan.kept(base);
  commit(checked, eos_ids, room)              the committed tokens: cut after an EOS, finished at
      -> (tokens, finished)                   EOS or when the token budget is used up;
  settle(plan, out, base, seq) -> Step        everything after the forward, in this order: check,
                                              roll the cache back, the drafter's feedback and
                                              features, commit, the Step, the k policy's feedback;
                                              seq: the sequence's Decoding (cache, drafter, ...).

Features (hidden rows) for drafters that read the target's (Medusa, EAGLE) are the forward's rows
`checked.rows`: the root's and the accepted path's, the positions that stay in the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from specdecode.backends.lm import Output
from specdecode.core.drafter import Drafter
from specdecode.core.plan import Plan
from specdecode.core.sampling import Warp, warp
from specdecode.core.tree_verify import verify_tree_greedy, verify_tree_rejection
from specdecode.core.verify import verify_greedy, verify_rejection
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.control import KPolicy
from specdecode.decoding.logprobs import TokenLogprob, token_logprobs


@dataclass
class Step:
    tokens: list[int]  # tokens committed by this step (accepted drafts + one target token)
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    draft_s: float  # time spent in the drafter
    verify_s: float  # time spent in the target forward and verification
    prefill_s: float = 0.0  # first step only: the prompt's prefill
    finished: bool = False  # EOS or max_new_tokens reached
    depth: int | None = None  # draft positions checked (a tree's depth); None: a chain's, = drafted
    error: Exception | None = (
        None  # the batched core: this sequence's row failed (drafter or verifier); it stops
    )
    prefilling: bool = False  # the batched core: the sequence was still prefilling its prompt (no tokens)
    logprobs: list[TokenLogprob] | None = None  # the target's, per committed token, when asked (logprobs.py)

    @property
    def positions(self) -> int:
        """Draft positions checked: what per-position counters count (a tree's nodes are no positions)."""
        return self.drafted if self.depth is None else self.depth

    @property
    def from_draft(self) -> list[bool]:
        """Per committed token: an accepted draft (else the target's own; cut after an EOS)."""
        return ([True] * self.accepted + [False])[: len(self.tokens)]


@dataclass
class Checked:
    path: list[int]  # accepted draft nodes in order (a chain: 0..a-1)
    accepted: list[int]  # their tokens
    next_token: int  # recovered or bonus token
    drafted: int  # draft tokens (tree nodes) the target checked
    depth: int  # longest draft path

    @property
    def rows(self) -> list[int]:
        """The forward's rows that stay in the cache: the root (row 0) and the accepted path."""
        return [0] + [1 + i for i in self.path]

    def kept(self, base: int) -> tuple[int, list[int]]:
        """keep(length, indices) arguments after a forward that started at `base` cached tokens."""
        return base + 1, [base + 1 + i for i in self.path]


def check(plan: Plan, logits: torch.Tensor, params: Warp, generator: torch.Generator | None) -> Checked:
    """logits: [1 + n, V], the target's rows for plan.tokens -> the verdict (core/verify.py, tree_verify)."""
    if plan.tree is None:
        if params.greedy:  # on lists: every torch call after a forward starts cold
            drafted = plan.tokens.tolist()[1:]
            verdict = verify_greedy(drafted, logits)
        else:
            draft = plan.tokens[1:].to(logits.device)
            verdict = verify_rejection(draft, plan.probs, warp(logits, params), generator)
            drafted = draft.tolist()
        a = verdict.accepted
        return Checked(list(range(a)), drafted[:a], verdict.next_token, len(drafted), len(drafted))
    tree = plan.tree
    if params.greedy:
        verdict = verify_tree_greedy(tree, logits)
    else:
        verdict = verify_tree_rejection(tree, plan.probs, warp(logits, params), generator)
    return Checked(
        verdict.path, [tree.tokens[i] for i in verdict.path], verdict.next_token, len(tree), tree.max_depth
    )


def commit(checked: Checked, eos_ids: set[int] | frozenset[int], room: int) -> tuple[list[int], bool]:
    """The tokens a step commits (accepted drafts, then the target's token), cut after the first
    EOS; finished at EOS or when they fill the `room` left for new tokens."""
    new = checked.accepted + [checked.next_token]
    for i, token in enumerate(new):
        if token in eos_ids:
            return new[: i + 1], True
    return new, len(new) >= room


class Cache(Protocol):
    """One sequence's KV cache as the step rolls it back: a CausalLM, or one slot of a BatchLM."""

    def truncate(self, length: int) -> None: ...

    def keep(self, length: int, indices: list[int]) -> None: ...


@dataclass(frozen=True)
class Decoding:
    """One sequence as settle() works on it, the same at every step: its cache (a CausalLM, or one
    slot of a BatchLM), drafter, k policy, sampling and stop tokens. constraints: penalties and a
    grammar on each row given its drafted prefix after `context` (every committed token, prompt
    included, extended by the caller; constraints.py); logprobs: each Step carries its tokens' raw
    target logprobs with this many top ones (logprobs.py)."""

    cache: Cache
    drafter: Drafter
    policy: KPolicy
    params: Warp
    generator: torch.Generator | None
    eos_ids: set[int] | frozenset[int]
    constraints: Constraints | None = None
    context: list[int] = ()
    logprobs: int | None = None


def settle(
    planned: Plan,
    out: Output,
    base: int,
    seq: Decoding,
    *,
    room: int,
    draft_s: float,
    verify_s: Callable[[], float],
    prefill_s: float = 0.0,
) -> Step:
    """Everything after the target's forward over `planned.tokens` (which started at `base` cached
    tokens; out.logits [1 + n, V]), written once for one sequence and for a batch row: verify, roll
    the cache back to the root and the accepted path, give the drafter its feedback and the kept
    rows' features, commit at most `room` tokens, and let the k policy observe the Step.
    draft_s: the seconds the drafter took; verify_s() -> the seconds the step's verification took,
    asked once the step is settled; prefill_s: the prompt's, on a sequence's first step."""
    constraints = seq.constraints
    logits = out.logits if constraints is None else constraints.process(seq.context, planned, out.logits)
    checked = check(planned, logits, seq.params, seq.generator)
    if planned.tree is None:
        seq.cache.truncate(base + 1 + len(checked.path))  # drop the rejected drafts
    else:
        seq.cache.keep(*checked.kept(base))  # move the accepted path up to follow the root
    seq.drafter.observe(checked.drafted, len(checked.accepted))
    if seq.drafter.layers:
        rows = checked.rows  # a chain keeps its first rows: a view, not a gather
        seq.drafter.feed(out.features[: len(rows)] if planned.tree is None else out.features[rows])
    new, finished = commit(checked, seq.eos_ids, room)
    if constraints is not None:
        constraints.commit(new)
    step = Step(
        new,
        checked.drafted,
        len(checked.accepted),
        draft_s,
        verify_s(),
        prefill_s,
        finished,
        checked.depth,
        logprobs=None
        if seq.logprobs is None
        else token_logprobs(out.logits[checked.rows[: len(new)]], new, seq.logprobs),
    )
    seq.policy.observe(step)
    return step

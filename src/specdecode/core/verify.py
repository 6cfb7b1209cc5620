"""Verification of a chain of draft tokens against the target, as pure functions.

Vocabulary used everywhere in specdecode:
- p: the target's distribution, q: the drafter's distribution, both after the same `warp`.
- accepted tokens: the leading draft tokens the target agrees with.
- recovered token: on the first rejection, the token drawn in its place from norm(max(0, p - q))
  (greedy: the target's argmax).
- bonus token: when every draft token is accepted, one more token drawn from the target's
  distribution after the last draft token, which the verify forward computed for free.
Each verification therefore commits `accepted + 1` tokens.

Rejection sampling follows Leviathan et al. 2023 ("Fast Inference from Transformers via
Speculative Decoding") and Chen et al. 2023 ("Accelerating LLM Decoding with Speculative
Sampling"): the committed tokens are distributed exactly as if sampled from p alone.
A drafter without probabilities (n-gram lookup) is treated as one-hot q.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.core.sampling import argmax_ids, sample


def check_ids(ids: list[int], vocab_size: int) -> None:
    """Raise ValueError on a draft id outside [0, vocab_size): a buggy drafter must fail loudly. On a
    list: a torch op right after a forward starts cold (docs/native_forward.md; stack.cpp's forward_ids)."""
    if any(t < 0 or t >= vocab_size for t in ids):
        raise ValueError(f"draft token id out of range [0, {vocab_size}): {ids}")


def check_inputs(draft: torch.Tensor, vocab_size: int, *probs: torch.Tensor | None) -> None:
    """Raise ValueError on a draft id outside [0, vocab_size) or a non-finite or negative
    probability: a buggy drafter or a numerical failure must fail loudly, not be accepted."""
    check_ids(draft.tolist(), vocab_size)
    for t in probs:  # a NaN makes the minimum NaN, an inf the sum inf: two reductions, not four passes
        if t is not None and t.numel() and not (t.min() >= 0 and torch.isfinite(t.sum())):
            raise ValueError(
                "probabilities must be finite and non-negative (got NaN, inf or a negative value)"
            )


@dataclass(frozen=True)
class Verdict:
    accepted: int  # number of draft tokens accepted (0..k)
    next_token: int  # recovered token if accepted < k, else the bonus token


def verify_greedy(drafted: list[int], target_logits: torch.Tensor) -> Verdict:
    """drafted: k token ids; target_logits: [k+1, V] -> accept while draft == target argmax."""
    check_ids(drafted, target_logits.shape[-1])
    choice = argmax_ids(target_logits)  # k+1
    accepted = next((i for i, (d, c) in enumerate(zip(drafted, choice)) if d != c), len(drafted))
    return Verdict(accepted, choice[accepted])


def verify_rejection(
    draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """draft: [k]; draft_probs q: [k, V] or None (one-hot); target_probs p: [k+1, V].

    Token i is accepted with probability min(1, p_i(d_i) / q_i(d_i)), never when q_i(d_i) = 0 (a
    drafter cannot have drawn it; as vLLM's rejection sampler). On the first rejection the
    recovered token is drawn from norm(max(0, p_i - q_i)); if all are accepted the bonus token is
    drawn from p_k. Always consumes k uniforms and then one categorical draw from `generator`.
    """
    check_inputs(draft, target_probs.shape[-1], draft_probs, target_probs)
    k = draft.shape[0]
    idx = torch.arange(k, device=draft.device)
    p_draft = target_probs[idx, draft]  # [k]
    q_draft = draft_probs[idx, draft] if draft_probs is not None else torch.ones_like(p_draft)
    u = torch.rand(k, generator=generator, device=target_probs.device)
    rejected = ((q_draft <= 0) | (u * q_draft >= p_draft)).nonzero()
    if not rejected.numel():
        return Verdict(k, sample(target_probs[k], generator))
    i = int(rejected[0])
    if draft_probs is not None:
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
    else:
        residual = target_probs[i].clone()
        residual[draft[i]] = 0
    total = residual.sum()
    # total == 0 only when p_i == q_i, where rejection has probability zero; guard rounding anyway.
    residual = residual / total if total > 0 else target_probs[i]
    return Verdict(i, sample(residual, generator))

"""The target's log-probabilities of the tokens a step commits, read off the verification forward.

A step commits its accepted drafts and one target token; the committed token j was predicted by the
forward's row `checked.rows[j]` (the root, then the accepted path: step.py), the same distribution
plain decoding computes for that position. Log-probabilities are those of the target's raw logits
(log_softmax before penalties, grammar masks, temperature, top-k and top-p), as vLLM's default
`raw_logprobs` and as plain decoding would report them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]]  # the `top` most likely tokens at this position, most likely first


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits: [T, V] the rows that predicted `tokens` ([T] ids) -> one TokenLogprob per token."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [T, V]
    chosen = logp[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)].tolist()
    if top > 0:
        values, ids = logp.topk(top, dim=-1)  # [T, top]
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [[] for _ in tokens]
    return [TokenLogprob(t, lp, tp) for t, lp, tp in zip(tokens, chosen, tops)]

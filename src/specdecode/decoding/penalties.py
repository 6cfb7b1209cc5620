"""Repetition penalties as pure functions of logits and token counts (OpenAI's and vLLM's definitions).

For a token t, with c(t) its count among the generated tokens and `seen` the tokens of the prompt or
the generated text:
- presence_penalty:  logit(t) -= presence * [c(t) > 0]          (OpenAI; over generated tokens)
- frequency_penalty: logit(t) -= frequency * c(t)               (OpenAI; over generated tokens)
- repetition_penalty (an extension, as vLLM and HF transformers, after Keskar et al. 2019, "CTRL"):
  for t in seen, logit(t) / r when the logit is positive, logit(t) * r otherwise.
They change the target's logits before temperature, top-k and top-p (sampling.warp).

Under speculation the target's row for a drafted position is penalized with the counts of the
committed text *plus the drafts before that position* (`penalize_rows`). Each row is then exactly the
penalized distribution plain decoding would use had it generated that drafted prefix, so rejection
sampling stays exact for the penalized distribution, and greedy output is the penalized greedy output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.errors import UserError


@dataclass(frozen=True)
class Penalties:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0  # 1: none

    def __post_init__(self):
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not -2.0 <= value <= 2.0:
                raise UserError(f"{name} must be in [-2, 2], got {value}")
        if not 0 < self.repetition <= 10:
            raise UserError(f"repetition_penalty must be in (0, 10], got {self.repetition}")

    @property
    def active(self) -> bool:
        return self.presence != 0 or self.frequency != 0 or self.repetition != 1


def penalize(logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, pen: Penalties) -> torch.Tensor:
    """logits: [..., V]; counts: [..., V] generated-token counts; seen: [..., V] bool, in the prompt or
    generated -> penalized float32 logits [..., V] (a new tensor)."""
    out = logits.float()
    if pen.repetition != 1:
        out = torch.where(seen, torch.where(out > 0, out / pen.repetition, out * pen.repetition), out)
    if pen.frequency:
        out = out - pen.frequency * counts
    if pen.presence:
        out = out - pen.presence * (counts > 0).float()
    return out


def penalize_rows(
    logits: torch.Tensor, prompt: list[int], generated: list[int], prefixes: list[list[int]], pen: Penalties
) -> torch.Tensor:
    """logits: [R, V], row r the target's distribution after the committed text and then the drafted
    tokens `prefixes[r]` -> [R, V] penalized, each row with the counts of generated + prefixes[r]."""
    rows, vocab = logits.shape
    base = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=vocab).float()  # [V]
    counts = base.expand(rows, vocab).clone()  # [R, V]
    for r, prefix in enumerate(prefixes):
        if prefix:
            counts[r] += torch.bincount(torch.tensor(prefix, dtype=torch.long), minlength=vocab).float()
    in_prompt = torch.zeros(vocab, dtype=torch.bool)
    if pen.repetition != 1 and prompt:
        in_prompt[torch.tensor(prompt, dtype=torch.long)] = True
    seen = in_prompt | (counts > 0)  # [R, V]
    return penalize(logits, counts, seen, pen)

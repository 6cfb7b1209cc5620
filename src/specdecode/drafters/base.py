"""The drafter protocol: propose up to k tokens for a context, observe how many were accepted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdecode.sampling import SamplingParams


@dataclass
class Proposal:
    tokens: torch.Tensor  # [k] draft token ids (k may be 0: nothing to propose)
    probs: torch.Tensor | None = None  # [k, V] q after warp, or None for a one-hot drafter

    @classmethod
    def empty(cls) -> "Proposal":
        return cls(torch.empty(0, dtype=torch.long))


class Drafter(Protocol):
    name: str

    def begin(self, prompt: list[int]) -> None:
        """A new request starts with these prompt tokens."""

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """Propose at most k tokens to follow `context` (every committed token so far)."""

    def observe(self, drafted: int, accepted: int) -> None:
        """Feedback after verification: `accepted` of the `drafted` tokens were kept."""

"""`draft:<model>`: a separate small causal LM with the target's tokenizer drafts k tokens
autoregressively, keeping its own KV cache in step with the committed context.
"""

from __future__ import annotations

import torch

from specdecode.drafters.base import Proposal
from specdecode.models import CausalLM
from specdecode.sampling import SamplingParams, sample, warp


class DraftModelDrafter:
    name = "draft"

    def __init__(self, model: CausalLM, target_vocab_size: int):
        self.model = model
        self.vocab_size = target_vocab_size
        self.cached: list[int] = []  # tokens whose keys/values sit in the draft model's cache

    def begin(self, prompt):
        self.model.reset()
        self.cached = []

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Roll the cache back to the longest prefix it shares with context, feed the rest.
        Returns the logits [V] for the token after context."""
        n = min(len(self.cached), len(context) - 1)
        if self.cached[:n] != context[:n]:
            n = next(i for i, (a, b) in enumerate(zip(self.cached, context)) if a != b)
        self.model.truncate(n)
        logits = self.model.extend(torch.tensor(context[n:], dtype=torch.long), num_logits=1)[-1]
        self.cached = list(context)
        return logits

    def _align(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [V_draft] -> [V_target] (padded vocabularies differ in size, not in ids)."""
        if logits.shape[-1] >= self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_size - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def propose(self, context, k, params: SamplingParams, generator):
        logits = self._align(self._sync(context))
        tokens, probs = [], []
        for i in range(k):
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = warp(logits, params)
                token = sample(q, generator)
                probs.append(q)
            tokens.append(token)
            if i < k - 1:
                logits = self._align(self.model.extend(torch.tensor([token]), num_logits=1)[-1])
                self.cached.append(token)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(probs) if probs else None)

    def observe(self, drafted, accepted):
        pass

"""`draft:<model>`: a separate small causal LM with the target's tokenizer drafts k tokens
autoregressively, keeping its own KV cache in step with the committed context.
"""

from __future__ import annotations

import torch

from specdecode.core.drafter import Proposal
from specdecode.core.sampling import Warp, argmax, sample, warp
from specdecode.drafters.draft_lm import DraftLM


class DraftModelDrafter(DraftLM):
    name = "draft"

    def propose(self, context, k, params: Warp, generator):
        logits = self.align(self.sync(context))
        tokens, probs = [], []
        for i in range(k):
            if params.greedy:
                token = int(argmax(logits))
            else:
                q = warp(logits, params)
                token = sample(q, generator)
                probs.append(q)
            tokens.append(token)
            if i < k - 1:
                logits = self.align(self.model.extend(torch.tensor([token]), num_logits=1)[-1])
                self.cached.append(token)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(probs) if probs else None)

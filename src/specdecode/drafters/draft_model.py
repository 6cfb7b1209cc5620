"""`draft:<model>`: a separate small causal LM with the target's tokenizer drafts k tokens
autoregressively, keeping its own KV cache in step with the committed context.

`draft:stop=P:<model>` ends a chain early, once the product of its tokens' draft probabilities falls
below P percent (the chain's odds of surviving verification, as the draft sees them; EAGLE-2 grows
its trees by the same cumulative confidence, and Hugging Face's assisted generation stops on one
token's, `assistant_confidence_threshold`). Each draft step costs a full pass of the draft model while
a verification row costs little (docs/native_forward.md), so a step stops paying for drafts the target
will likely reject. Which tokens are proposed changes, never what is emitted: greedy verification
keeps the target's argmax, and with sampling the stopping rule looks only at the draft's own
distributions, so rejection sampling stays exact.
"""

from __future__ import annotations

import torch

from specdecode.core.drafter import Proposal
from specdecode.core.sampling import Warp, argmax, sample, warp
from specdecode.drafters.draft_lm import DraftLM


class DraftModelDrafter(DraftLM):
    name = "draft"

    def __init__(
        self, model, target_vocab_size: int, token_map: torch.Tensor | None = None, stop: float = 0.0
    ):
        """stop: end the chain once the product of its draft probabilities is below this (0: never)."""
        super().__init__(model, target_vocab_size, token_map)
        self.stop = stop

    def propose(self, context, k, params: Warp, generator):
        logits = self.align(self.sync(context))
        tokens, probs, survive = [], [], 1.0
        for i in range(k):
            if params.greedy:
                token = int(argmax(logits))
                if self.stop:
                    survive *= float(torch.softmax(logits.float(), -1)[token])
            else:
                q = warp(logits, params)
                token = sample(q, generator)
                probs.append(q)
                survive *= float(q[token])
            tokens.append(token)
            if i == k - 1 or survive < self.stop:
                break
            logits = self.align(self.model.extend(torch.tensor([token]), num_logits=1)[-1])
            self.cached.append(token)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(probs) if probs else None)

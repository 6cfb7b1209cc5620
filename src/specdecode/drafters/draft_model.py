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

`draft:stop=auto:<model>` sets P to c + v, measured once when the drafter is built (`chain_costs`):
c the time of one draft pass and v the target's cost of one more verification row, each over the
time of one target pass. One more draft token costs about c + v target steps and saves one step if
the target accepts it, and the chain's draft probability stands in for that chance: drafting goes on
while it is worth its cost. Where rows are nearly free (AVX-512 VNNI: v ~0.03) a draft a third the
target's cost stops near 36% (the Qwen2.5-Coder 0.5B / 1.5B pair: 40 measured best of 20 and 40,
docs/drafters.md); where a row costs 0.15 of a step (AVX2) the same pair stops near 50%; a draft far
cheaper than a cheap row hardly stops at all.
"""

from __future__ import annotations

import statistics
import time

import torch

from specdecode.backends.lm import CausalLM
from specdecode.core.drafter import Proposal
from specdecode.core.sampling import Warp, argmax, sample, warp
from specdecode.drafters.draft_lm import DraftLM


class DraftModelDrafter(DraftLM):
    name = "draft"

    def __init__(
        self,
        model,
        target_vocab_size: int,
        token_map: torch.Tensor | None = None,
        stop: float = 0.0,
        window: int | None = None,
    ):
        """stop: end the chain once the product of its draft probabilities is below this (0: never);
        window: draft_lm.py's."""
        super().__init__(model, target_vocab_size, token_map, window)
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


def chain_costs(
    draft: CausalLM | None, target: CausalLM, repeats: int = 5, rows: int = 5
) -> tuple[float, float]:
    """(c, v): the median time of a draft pass over one token / the target's (0 without a draft model),
    and the target's extra time per verification row, (T(rows) - T(1)) / (rows - 1) / T(1):
    interleaved, after a warm-up, each on a fork with a cache of its own, so a model already serving
    requests is left untouched."""
    twin = target.fork()
    runs = [(twin, 1), (twin, rows)] + ([(draft.fork(), 1)] if draft is not None else [])
    samples: list[list[float]] = [[] for _ in runs]
    for i in range(repeats + 1):
        for (model, n), times in zip(runs, samples):
            model.reset()
            t0 = time.perf_counter()
            model.extend(torch.zeros(n, dtype=torch.long), num_logits=n)
            if i:  # the first pass of each is the warm-up
                times.append(time.perf_counter() - t0)
    one, many, *draft_s = (statistics.median(times) for times in samples)
    return (draft_s[0] / one if draft_s else 0.0), max(0.0, (many - one) / (rows - 1) / one)

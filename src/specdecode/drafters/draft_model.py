"""`draft:<model>`: a separate small causal LM with the target's tokenizer drafts k tokens
autoregressively, keeping its own KV cache in step with the committed context.

`draft:stop=P:<model>` ends a chain early: it keeps a token while the product of the chain's draft
probabilities up to it is at least P percent (the chain's odds of surviving verification, as the draft
sees them; EAGLE-2 grows its trees by the same cumulative confidence, and Hugging Face's assisted
generation stops on one token's, `assistant_confidence_threshold`). Which tokens are proposed changes,
never what is emitted: greedy verification keeps the target's argmax, and with sampling a token is
judged on its expected probability (the sum of q squared) before it is drawn, never on its own draw,
and the chain's later tokens on the drawn ones: a stopping rule, so rejection sampling stays exact.

`draft:stop=auto:<model>` prices the chain instead (chain_stop.py): a token is kept while its odds pay
its verification row, r(i) - r(i-1) of a target step, as the engine measures r now, and the next one
drafted while they pay a draft pass (c, measured when the drafter is built by `chain_costs`) and its
row. Where rows are nearly free (AVX-512 VNNI: ~0.03) a draft a third the target's cost stops near 36%;
where a row costs a third of a step (the 1.5B on AVX2) a chain's tokens need odds of a third; a
draft far cheaper than a cheap row hardly stops at all.
"""

from __future__ import annotations

import statistics
import time

import torch

from specdecode.backends.lm import CausalLM
from specdecode.core.drafter import Proposal
from specdecode.core.sampling import Warp, argmax, sample, warp
from specdecode.drafters.chain_stop import ChainStop
from specdecode.drafters.draft_lm import DraftLM


class DraftModelDrafter(DraftLM):
    name = "draft"

    def __init__(
        self,
        model,
        target_vocab_size: int,
        token_map: torch.Tensor | None = None,
        stop: float | ChainStop = 0.0,
        window: int | None = None,
    ):
        """stop: keep a chain's tokens while the product of their draft probabilities is at least this,
        or pays their rows (a ChainStop, chain_stop.py); 0: never stop; window: draft_lm.py's."""
        super().__init__(model, target_vocab_size, token_map, window)
        self.stop = ChainStop.of(stop)

    def propose(self, context, k, params: Warp, generator):
        logits = self.align(self.sync(context))
        tokens, probs, survive = [], [], 1.0
        keep, go_on = self.stop.bars(k)
        for i in range(k):
            if params.greedy:
                token = int(argmax(logits))
                if self.stop.active:
                    p = known = float(torch.softmax(logits.float(), -1)[token])
            else:
                q = warp(logits, params)
                known = float(q.square().sum())  # a sampled token is kept on its expected odds: lossless
                token = sample(q, generator)
                probs.append(q)
                p = float(q[token])
            if self.stop.active:
                if survive * known < keep[i]:  # not worth its verification row
                    probs = probs[:i]
                    break
                survive *= p
            tokens.append(token)
            if i == k - 1 or survive < go_on[i]:  # the next: not worth a draft pass and its row
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

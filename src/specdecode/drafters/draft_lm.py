"""A draft language model's KV cache kept in step with the committed context: the part every drafter
built on a separate draft model shares (draft_model.py chains, draft_tree.py trees, cross_vocab.py).

`window=W`: the draft reads a long prompt's first SINK tokens and its last W, not the middle. A draft
model's prefill over the whole prompt is a fixed cost every request pays before its first draft
(the 0.5B beside the 1.5B: a third of the target's own prefill, measured on Zen 3), which a short
answer never earns back. The tokens kept are positioned one after another (rotary positions are
relative), as StreamingLLM keeps its attention sinks (Xiao et al. 2023). Which tokens are proposed
changes, never what is emitted: the target verifies every draft.
"""

from __future__ import annotations

import torch

from specdecode.backends.lm import CausalLM
from specdecode.core.drafter import Drafter, Learned

SINK = 4  # leading tokens a windowed draft always reads (the attention sinks)


class DraftLM(Drafter):
    """Holds `model` (a CausalLM with its own cache) and `cached`, the tokens its cache holds."""

    def __init__(
        self,
        model: CausalLM,
        target_vocab_size: int,
        token_map: torch.Tensor | None = None,
        window: int | None = None,
    ):
        """token_map: [Vd] the target ids of the model's logits when it predicts over a draft
        vocabulary (draft_vocab.frequent_tokens), else None (the model's own ids). window: read a
        prompt longer than SINK + window through its first SINK and last `window` tokens only."""
        self.model = model
        self.vocab_size = target_vocab_size
        self.token_map = token_map
        self.window = window
        self.cached: list[int] = []  # tokens whose keys/values sit in the draft model's cache
        self.dropped = (0, 0)  # context[a:b] the draft does not read (a window's middle), (0, 0): none

    def begin(self, prompt):
        self.model.reset()
        self.cached = []
        self.dropped = (0, 0)
        if self.window is not None and len(prompt) > SINK + self.window:
            self.dropped = (SINK, len(prompt) - self.window)

    def view(self, context: list[int]) -> list[int]:
        """The tokens of context the draft reads (context itself without a window)."""
        a, b = self.dropped
        return context[:a] + context[b:] if b else context

    def sync(self, context: list[int]) -> torch.Tensor:
        """Roll the cache back to the longest prefix it shares with the context's view, feed the rest.
        Returns the logits [V_draft] for the token after context."""
        context = self.view(context)
        n = min(len(self.cached), len(context) - 1)
        if self.cached[:n] != context[:n]:
            n = next(i for i, (a, b) in enumerate(zip(self.cached, context)) if a != b)
        self.model.truncate(n)
        logits = self.model.extend(torch.tensor(context[n:], dtype=torch.long), num_logits=1)[-1]
        self.cached = list(context)
        return logits

    def align(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., V_draft] -> [..., V_target] (padded vocabularies differ in size, not in ids;
        a draft vocabulary's logits go to their ids, -inf elsewhere)."""
        if self.token_map is not None:
            full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
            return full.index_copy_(-1, self.token_map, logits)
        if logits.shape[-1] >= self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_size - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def fork(self, learned: Learned | None = None) -> "DraftLM":
        """The same draft weights with a KV cache of its own."""
        twin = super().fork()
        twin.model, twin.cached, twin.dropped = self.model.fork(), [], (0, 0)
        return twin

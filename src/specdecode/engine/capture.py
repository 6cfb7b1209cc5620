"""A request's target features (Request.capture): the rows of the layers it names (lm.Output's
convention: -1 is the final norm's output, the LM head's input) at every position of its prompt and
completion but the last, taken from the forwards that decode it: no second pass. `train data
--features` stores them for the EAGLE and Medusa trainers (train/features.py), as vLLM's hidden-state
extraction feeds EAGLE-3 training in the speculators project.

The engine hands a request's drafter to Capture, which asks the forwards for its layers and the
drafter's own and keeps its columns: the drafter sees what it saw before. A preempted request
begins again (begin): its rows are taken again from the prefill of everything it had committed.
"""

from __future__ import annotations

import torch

from specdecode.core.drafter import Drafter


class Capture(Drafter):
    def __init__(self, inner: Drafter, layers: tuple[int, ...]):
        self.inner, self.capture = inner, tuple(layers)
        self.name = inner.name
        self.layers = self.capture + tuple(inner.layers)
        self.kept: list[torch.Tensor] = []  # [m, len(capture) * H] per feed, in position order

    def begin(self, prompt):
        self.kept = []
        self.inner.begin(prompt)

    def propose(self, context, k, params, generator):
        return self.inner.propose(context, k, params, generator)

    def observe(self, drafted, accepted):
        self.inner.observe(drafted, accepted)

    def feed(self, features):
        """features [m, len(layers) * H]: the captured layers' columns first, then the drafter's."""
        width = features.shape[1] // len(self.layers)
        cut = len(self.capture) * width
        self.kept.append(features[:, :cut].clone())  # a view would pin the whole forward's output
        if self.inner.layers:
            self.inner.feed(features[:, cut:])

    def rows(self, positions: int) -> torch.Tensor:
        """The captured rows of the first `positions` positions -> [positions, len(capture) * H]. A step
        keeps the rows of every token it accepts; one that stops at EOS or max_tokens commits fewer."""
        rows = torch.cat(self.kept) if self.kept else torch.zeros(0, 0)
        if len(rows) < positions:
            raise RuntimeError(f"capture: rows for {len(rows)} positions, {positions} asked")
        return rows[:positions]

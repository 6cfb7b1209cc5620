"""`none`: proposes nothing, so the decoder does plain autoregressive decoding (the baseline)."""

from __future__ import annotations

from specdecode.drafters.base import Proposal


class NoDrafter:
    name = "none"

    def begin(self, prompt):
        pass

    def propose(self, context, k, params, generator):
        return Proposal.empty()

    def observe(self, drafted, accepted):
        pass

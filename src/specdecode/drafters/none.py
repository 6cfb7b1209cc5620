"""`none`: proposes nothing, so the decoder does plain autoregressive decoding (the baseline)."""

from __future__ import annotations

from specdecode.core.drafter import Drafter, Proposal


class NoDrafter(Drafter):
    name = "none"

    def propose(self, context, k, params, generator):
        return Proposal.empty()

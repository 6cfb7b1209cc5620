"""`fallback:A+B[+...]`: the first member with a proposal drafts the step (e.g. `fallback:ngram+eagle:k=1`:
prompt lookup where the context repeats itself, the EAGLE head elsewhere).

Members are asked in order and the later ones only when the earlier ones have nothing, so a step costs
one member's drafting, and the target verifies that member's chain or tree as it would alone (q
included: lossless with sampling too). A member's `k=N` caps its draft length below the step's k. A
feature-reading member is fed every step whether it drafted or not (EAGLE catches up on its next turn).
"""

from __future__ import annotations

from specdecode.core.drafter import Drafter, Learned, Proposal, feed_members


class FallbackDrafter(Drafter):
    name = "fallback"

    def __init__(self, members: list[Drafter], caps: list[int | None]):
        self.members, self.caps = members, caps
        self.layers = tuple(i for m in members for i in m.layers)  # members' layers, in order
        self.drafted_by: Drafter | None = None  # the member whose proposal the last step verified

    def fork(self, learned: Learned | None = None) -> "FallbackDrafter":
        twin = super().fork()
        twin.members = [m.fork(learned) for m in self.members]
        return twin

    def feed(self, features):
        feed_members(self.members, features)  # features [m, len(layers) * H]

    def begin(self, prompt):
        for member in self.members:
            member.begin(prompt)
        self.drafted_by = None

    def propose(self, context, k, params, generator):
        for member, cap in zip(self.members, self.caps):
            proposal = member.propose(context, min(k, cap or k), params, generator)
            if proposal.tokens.numel():
                self.drafted_by = member
                return proposal
        self.drafted_by = None
        return Proposal.empty()

    def observe(self, drafted, accepted):
        if self.drafted_by is not None:
            self.drafted_by.observe(drafted, accepted)

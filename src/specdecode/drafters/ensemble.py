"""`ensemble:A+B[+...]`: several drafters' proposals merged into one token tree per step
(e.g. `ensemble:ngram+draft:<model>`), so the target checks all of them in one forward.

Members propose in order with the step's k (or their own `k=N` cap, if lower); their chains and trees
are merged into one trie (shared prefixes stored once, earlier members' tokens tried first among
siblings). A merged tree is verified
with one-hot q: lossless whatever the members drew (see tree_verify.py), though with sampling it
accepts a sampled member's tokens less often than that member would alone. When only one member
proposes anything, its proposal passes through unchanged, q included.
"""

from __future__ import annotations

from specdecode.core.drafter import Drafter, Learned, Proposal, feed_members
from specdecode.core.tree import Tree


class EnsembleDrafter(Drafter):
    name = "ensemble"

    def __init__(self, members: list[Drafter], caps: list[int | None] | None = None):
        self.members, self.caps = members, caps or [None] * len(members)
        self.layers = tuple(i for m in members for i in m.layers)  # members' layers, in order

    def fork(self, learned: Learned | None = None) -> "EnsembleDrafter":
        twin = super().fork()
        twin.members = [m.fork(learned) for m in self.members]
        return twin

    def feed(self, features):
        feed_members(self.members, features)  # features [m, len(layers) * H]

    def begin(self, prompt):
        for member in self.members:
            member.begin(prompt)

    def propose(self, context, k, params, generator):
        proposals = [
            m.propose(context, min(k, cap or k), params, generator) for m, cap in zip(self.members, self.caps)
        ]
        proposals = [p for p in proposals if p.tokens.numel()]
        if not proposals:
            return Proposal.empty()
        if len(proposals) == 1:
            return proposals[0]
        return Proposal.of_tree(Tree.merge(p.tree() for p in proposals))

    def observe(self, drafted, accepted):
        for member in self.members:
            member.observe(drafted, accepted)

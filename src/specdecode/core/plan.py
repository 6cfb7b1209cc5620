"""What the target checks in one step: the last committed token (the root), then a drafter's
proposal cut to the step's budget, as a chain or a token tree (tree.py's +1 layout). Pure: a
Proposal in, a Plan out; the loop (decoding/step.py) runs the target on plan.tokens and checks the
drafts, and decoding/constraints.py cuts a plan the grammar forbids."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdecode.core.drafter import Proposal
from specdecode.core.tree import Tree, best_nodes


@dataclass
class Plan:
    """The target's input for one step: the last committed token (the root), then the drafts."""

    tokens: torch.Tensor  # [1 + n] long
    tree: Tree | None  # the drafts as a tree (+1 layout, tree.py); None: a chain
    probs: torch.Tensor | None  # [n, V] q of the drafts, None: one-hot

    def tree_args(self, base: int) -> dict:
        """forward() arguments placing a tree after `base` cached tokens (none for a chain)."""
        if self.tree is None:
            return {}
        return {"positions": self.tree.positions(base), "tree_mask": self.tree.mask()}


def plan(
    last: int, proposal: Proposal | None, budget: int, nodes: Callable[[list[float]], int] | None = None
) -> Plan:
    """A proposal cut so that the step commits at most budget + 1 tokens: a chain to its first
    `budget` drafts, a tree to the nodes at most `budget` deep; a tree whose drafter ranks its nodes
    (proposal.confidence) then to the `nodes(confidence)` most confident ones (a policy's tree_nodes)."""
    if proposal is None or budget <= 0:
        return Plan(torch.tensor([last]), None, None)
    probs = proposal.probs
    if proposal.parents is None:
        draft = proposal.tokens.tolist()[:budget]
        return Plan(
            torch.tensor([last] + draft, dtype=torch.long),
            None,
            probs[: len(draft)] if probs is not None else None,
        )
    tree, confidence = proposal.tree(), proposal.confidence
    kept = tree.up_to_depth(budget)
    if len(kept) < len(tree):
        tree = tree.subset(kept)
        probs = probs[kept] if probs is not None else None
        confidence = [confidence[i] for i in kept] if confidence is not None else None
    if nodes is not None and confidence is not None:
        kept = best_nodes(tree.parents, confidence, nodes(confidence))
        if len(kept) < len(tree):
            tree = tree.subset(kept)
            probs = probs[kept] if probs is not None else None
    return Plan(torch.tensor([last] + tree.tokens, dtype=torch.long), tree, probs)

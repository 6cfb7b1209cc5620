"""What a request changes in the target's distribution (penalties, a grammar), applied under speculation
so that verification stays exact for the changed distribution.

One sequence's `Constraints` takes part in each step at two points (batch_decoder.py, decoder.py):
- `cut(plan)`, before the forward: drafts the grammar forbids cannot be accepted. A chain is cut just
  before its first forbidden token. A tree loses the nodes below a forbidden node but keeps the node
  itself: the masked target gives it probability 0, so verification rejects it for sure, and the
  siblings after it are still tried against the residual their own q assumes (core/tree_verify.py).
- `process(context, plan, logits)`, on the forward's rows: row r is the target's distribution after
  the committed text and the drafted tokens before it (`row_prefixes`); it is penalized with the
  counts of that text (penalties.py) and masked by the grammar in the state after it (grammar.py).
  Every row is thus exactly what plain constrained decoding would sample from after that prefix, so
  greedy verification is token-identical to constrained greedy decoding, and rejection sampling draws
  from the constrained distribution (Leviathan et al. 2023, for any target distribution p).
- `commit(tokens)`: the committed tokens move the grammar on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdecode.core.plan import Plan
from specdecode.decoding.penalties import Penalties, penalize_rows

if TYPE_CHECKING:  # llguidance (and through llguidance.torch, torch's compiler: ~130 MB) loads with the
    from specdecode.decoding.grammar import Grammar  # first grammar a request brings (Engine.grammars)


def row_prefixes(plan: Plan) -> list[list[int]]:
    """Per row of the plan's forward: the drafted tokens between the committed text and that row
    (row 0, the root: none; a chain's row r: its first r drafts; a tree's row i + 1: node i's path)."""
    drafts = plan.tokens[1:].tolist()
    if plan.tree is None:
        return [drafts[:r] for r in range(len(drafts) + 1)]
    return [[]] + [[plan.tree.tokens[j] for j in plan.tree.path_to(i)] for i in range(len(plan.tree))]


class Constraints:
    def __init__(self, prompt: list[int], penalties: Penalties | None = None, grammar: Grammar | None = None):
        self.prompt_len = len(prompt)
        self.penalties = penalties if penalties is not None and penalties.active else None
        self.grammar = grammar

    def cut(self, plan: Plan) -> Plan:
        """The plan without drafts that verification could only reach through a forbidden token."""
        if self.grammar is None or len(plan.tokens) == 1:
            return plan
        if plan.tree is None:
            drafts = plan.tokens[1:].tolist()
            n = self.grammar.allowed(drafts)
            if n == len(drafts):
                return plan
            return Plan(plan.tokens[: 1 + n], None, plan.probs[:n] if plan.probs is not None else None)
        tree, ok = plan.tree, []
        for i, parent in enumerate(tree.parents):  # ok[i]: node i's path is allowed (parents come first)
            path = [tree.tokens[j] for j in tree.path_to(i)]
            ok.append((parent < 0 or ok[parent]) and self.grammar.allowed(path) == len(path))
        kept = [i for i, parent in enumerate(tree.parents) if parent < 0 or ok[parent]]
        if len(kept) == len(tree):
            return plan
        sub = tree.subset(kept)
        probs = plan.probs[kept] if plan.probs is not None else None
        return Plan(torch.tensor([int(plan.tokens[0])] + sub.tokens, dtype=torch.long), sub, probs)

    def process(self, context: list[int], plan: Plan, logits: torch.Tensor) -> torch.Tensor:
        """context: every committed token, prompt included; logits: [1 + n, V] the target's rows for
        plan.tokens -> [1 + n, V] float32, each row penalized and masked given its drafted prefix."""
        if self.penalties is None and self.grammar is None:
            return logits
        prefixes = row_prefixes(plan)
        if self.penalties is not None:
            out = penalize_rows(
                logits, context[: self.prompt_len], context[self.prompt_len :], prefixes, self.penalties
            )
        else:
            out = logits.float().clone()
        if self.grammar is not None:
            out = self.grammar.apply(out, prefixes)
        return out

    def commit(self, tokens: list[int]) -> None:
        if self.grammar is not None:
            self.grammar.commit(tokens)

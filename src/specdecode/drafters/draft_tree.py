"""`draft:b=B[:nodes=N]:<model>`: the draft model proposes a token tree, one draft forward per depth.

- Static (`b=B`): B branches from the root, each continued as a chain to depth k (B·k nodes). The
  branches start with the root's B most likely tokens (greedy), or with B tokens sampled without
  replacement from q (sampling; each carries q minus the earlier siblings, renormalised, so
  verification is recursive rejection sampling), and continue with argmax / samples from q.
  The shape never depends on the drawn tokens, which is what keeps sampled siblings lossless.
- Dynamic (`b=B:nodes=N`): EAGLE-2's tree of N nodes grown B children at a time (growth.py), ranked
  by the draft's probabilities (its warped q when sampling); tokens are chosen, so q is one-hot.
  `stop=P` ends the growth once no frontier path's draft probability reaches P% (as a chain's);
  `stop=auto` keeps the nodes whose path probability pays their verification rows and grows while the
  best frontier path pays a draft pass and the next row (chain_stop.py's rule, growth.dynamic).

The draft model's cache holds the committed context; tree nodes are fed after it and dropped again
once the tree is built (the next step re-feeds what was accepted together with the new token).
"""

from __future__ import annotations

import torch

from specdecode.core.drafter import Proposal
from specdecode.core.sampling import Warp, argmax, warp
from specdecode.core.tree import Tree
from specdecode.drafters.chain_stop import ChainStop
from specdecode.drafters.draft_lm import DraftLM
from specdecode.drafters.growth import Growth, draft_dist
from specdecode.errors import UserError


class DraftTreeDrafter(DraftLM):
    name = "draft-tree"

    def __init__(
        self,
        model,
        target_vocab_size: int,
        branches: int,
        nodes: int | None = None,
        token_map=None,
        stop: float | ChainStop = 0.0,
        window: int | None = None,
    ):
        """token_map: [Vd] the target ids of a draft vocabulary's logits (`vocab=N`), else None; stop: a
        dynamic tree stops growing once no frontier path's draft probability reaches it (0: never), or
        a ChainStop that prices its nodes' rows and its draft passes (growth.dynamic); window:
        draft_lm.py's."""
        super().__init__(model, target_vocab_size, token_map, window)
        if branches < 1 or (nodes is not None and nodes < 1):
            raise UserError(f"draft tree needs b >= 1 and nodes >= 1, got b={branches} nodes={nodes}")
        self.branches, self.nodes, self.stop = branches, nodes, stop

    def propose(self, context, k, params: Warp, generator):
        root = self.align(self.sync(context))  # [V]
        context = self.view(context)  # the tokens the draft's cache holds
        grow = _Growth(self.model, self.align, len(context), params)
        try:
            if self.nodes is None:
                return grow.static(root, k, self.branches, generator)
            tree, confidence = grow.dynamic(
                draft_dist(root, params).log(),
                k,
                self.branches,
                self.nodes,
                lambda frontier: draft_dist(grow.feed(frontier), params).log(),
                self.stop,
            )
            return Proposal.of_tree(tree, confidence=confidence)
        finally:
            self.model.truncate(len(context))  # keep only the committed context cached
            self.cached = list(context)


class _Growth(Growth):
    """A tree being grown over the draft model, which holds the committed context."""

    def __init__(self, model, align, context_length: int, params: Warp):
        super().__init__()
        self.model, self.align = model, align  # align: draft logits -> the target's vocabulary
        self.length, self.params = context_length, params

    def feed(self, frontier: list[int]) -> torch.Tensor:
        """Run the draft model on the frontier nodes (each sees its own ancestors) -> logits [F, V]."""
        mask = self.feed_mask(frontier)
        # the last context token sits at position length - 1, so depth d goes to length - 1 + d
        positions = torch.tensor([self.length - 1 + self.depth[n] for n in frontier], dtype=torch.long)
        tokens = torch.tensor([self.tokens[n] for n in frontier], dtype=torch.long)
        return self.align(self.model.extend_tree(tokens, positions, mask))

    def static(self, root: torch.Tensor, k: int, b: int, generator) -> Proposal:
        q = draft_dist(root, self.params)  # [V]
        b = min(b, int((q > 0).sum()))
        sampled = not self.params.greedy
        if sampled:
            # Without replacement: torch draws by exponential races, returned in draw order, which is
            # distributed as successive draws; sibling j then carries q minus siblings < j, renormalised.
            first = torch.multinomial(q, b, replacement=False, generator=generator).tolist()
            earlier = torch.ones(b, q.shape[0]).index_put_(
                (
                    torch.tensor([j for j in range(b) for _ in range(j)], dtype=torch.long),
                    torch.tensor([first[i] for j in range(b) for i in range(j)], dtype=torch.long),
                ),
                torch.tensor(0.0),
            )  # [b, V]: row j is 0 at the tokens of siblings < j
            rows = q * earlier
            probs = [rows / rows.sum(-1, keepdim=True)]
        else:
            first, probs = q.topk(b).indices.tolist(), []
        frontier = [self.add(-1, x) for x in first]
        for _ in range(1, k):
            logits = self.feed(frontier)  # [b, V]
            if sampled:
                rows = warp(logits, self.params)
                probs.append(rows)
                chosen = torch.multinomial(rows, 1, generator=generator)[:, 0].tolist()
            else:
                chosen = argmax(logits).tolist()
            frontier = [self.add(node, x) for node, x in zip(frontier, chosen)]
        tree = Tree(self.tokens, self.parents)  # nodes level by level, as the rows of probs
        return Proposal.of_tree(tree, torch.cat(probs) if probs else None)

"""Growing a token tree node by node: the part shared by drafters that propose trees (draft models,
Medusa heads, the EAGLE head).

`Growth` records nodes (token, parent, depth, score) and, for drafters that run a model over the
tree, which nodes that model already holds (`feed_mask`). `Growth.dynamic` is EAGLE-2's tree
(Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees"): a node's
score is the cumulative draft log-probability of its path; at each depth the b best nodes of the
previous depth get their b most likely children; at the end the `budget` best nodes of all of them
are kept (tree.best_nodes). Tokens are chosen, never sampled, so the tree's q is one-hot (q = None):
lossless under greedy and rejection sampling alike (tree_verify.py). Each kept node's exp(score), the
draft's probability of its whole path, goes with the tree as the drafter's confidence: an adaptive
policy (control.AdaptiveK.tree_nodes) may keep fewer of the nodes when the target's wider pass costs
more than they are expected to add.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from specdecode.core.sampling import Warp, warp
from specdecode.core.tree import Tree, best_nodes
from specdecode.drafters.chain_stop import ChainStop


def draft_dist(logits: torch.Tensor, params: Warp) -> torch.Tensor:
    """[..., V] draft logits -> the distribution a tree chooses and ranks tokens by: softmax when
    greedy, the warped q (temperature, top-k, top-p) when sampling."""
    return logits.float().softmax(-1) if params.greedy else warp(logits, params)


class Growth:
    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.depth: list[int] = []
        self.scores: list[float] = []
        self.slots: dict[int, int] = {}  # node -> its slot among the tree nodes a draft model holds

    def add(self, parent: int, token: int, score: float = 0.0) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1

    def tree(self) -> Tree:
        return Tree(list(self.tokens), list(self.parents))

    def feed_mask(self, frontier: list[int]) -> torch.Tensor:
        """The frontier nodes go into the next slots of a model already holding `slots`: -> mask
        [F, slots + F] bool, each frontier node seeing itself and its ancestors."""
        offset = len(self.slots)
        rows, cols = [], []
        for row, node in enumerate(frontier):
            rows.append(row)
            cols.append(offset + row)
            parent = self.parents[node]
            while parent >= 0:
                rows.append(row)
                cols.append(self.slots[parent])
                parent = self.parents[parent]
        mask = torch.zeros(len(frontier), offset + len(frontier), dtype=torch.bool)
        mask[rows, cols] = True
        for node in frontier:
            self.slots[node] = len(self.slots)
        return mask

    def dynamic(
        self,
        root_logq: torch.Tensor,
        k: int,
        b: int,
        budget: int,
        children_logq: Callable[[list[int]], torch.Tensor],
        stop: float | ChainStop = 0.0,
    ) -> tuple[Tree, list[float]]:
        """root_logq: [V] draft log-probabilities after the last committed token; children_logq
        (frontier nodes) -> [F, V] after each of them. Grows k levels, or fewer -> (the best `budget`
        nodes, or fewer, [n] each kept node's path probability under the draft).

        stop=P (a fraction, or a ChainStop fixed at P): the growth ends once no frontier path's draft
        probability reaches P. A ChainStop that prices rows (stop=auto) judges a tree as a chain
        (chain_stop.py): a node is expected to save a target step with its path probability, so the
        nodes, best first, are kept while each pays its own verification row, and the tree grows a
        level only while its best frontier path pays a drafter step and the next row."""
        priced = isinstance(stop, ChainStop) and stop.active and not stop.fixed
        keep, go_on = stop.bars(budget) if priced else ([], [])
        if isinstance(stop, ChainStop) and not priced:
            stop = stop.fixed

        def expand(parent: int, logq: torch.Tensor) -> list[int]:
            top = logq.topk(min(b, logq.shape[-1]))
            base = self.scores[parent] if parent >= 0 else 0.0
            return [
                self.add(parent, x, base + value)
                for value, x in zip(top.values.tolist(), top.indices.tolist())
                if value > float("-inf")
            ]  # never a token outside the draft's support

        level = expand(-1, root_logq)
        for _ in range(1, k):
            frontier = sorted(sorted(level, key=lambda i: -self.scores[i])[:b])
            if not frontier:
                break
            best = math.exp(max(self.scores[i] for i in frontier))
            if priced:
                paid = self.paid(keep)
                if not paid or best < go_on[paid - 1]:
                    break
            elif stop and best < stop:
                break
            level = [c for node, logq in zip(frontier, children_logq(frontier)) for c in expand(node, logq)]
        kept = best_nodes(self.parents, self.scores, self.paid(keep) if priced else budget)
        return self.tree().subset(kept), [math.exp(self.scores[i]) for i in kept]

    def paid(self, keep: list[float]) -> int:
        """How many nodes, best path probability first, pay their rows: node i's probability >= keep[i]."""
        ranked = sorted(self.scores, reverse=True)
        n = 0
        while n < min(len(ranked), len(keep)) and math.exp(ranked[n]) >= keep[n]:
            n += 1
        return n

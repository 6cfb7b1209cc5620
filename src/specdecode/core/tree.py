"""Token trees: several draft continuations sharing prefixes, verified by the target in one forward.

A tree holds N draft nodes in topological order (a parent comes before its children). Node i has
token `tokens[i]` and parent `parents[i]`; -1 means a child of the root, the last committed token,
which the decoder feeds together with the nodes. Siblings keep their order: verification tries them
first to last. A chain of k drafts is the degenerate tree with parents [-1, 0, 1, ..., k-2].

In the target's forward the root sits at index 0 and node i at index i + 1 (the "+1 layout"): it
runs on [root, tokens] at positions length + depth ([0] + depth), and token i attends to the cached
prefix and to its own ancestors (`mask`). Row i + 1 of the resulting logits is the target's
distribution after node i (row 0: after the root).

Trees are built from candidate sequences (`from_sequences`: a trie, shared prefixes stored once),
from other trees (`merge`) and by keeping the best nodes of a scored tree (`best_nodes`, EAGLE-2's
reranking: Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Tree:
    tokens: list[int]  # [N] node tokens
    parents: list[int]  # [N] parent node index, -1 = the root (last committed token); parents[i] < i
    depth: list[int] = field(init=False)  # [N] 1 for the root's children
    children: list[list[int]] = field(init=False)  # [N+1] +1 layout: children[0] are the root's

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        depth, children = [], [[] for _ in range(len(self.tokens) + 1)]
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must come before their children")
            depth.append(1 if parent < 0 else depth[parent] + 1)
            children[parent + 1].append(i)
        object.__setattr__(self, "depth", depth)
        object.__setattr__(self, "children", children)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "Tree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def child(self, node: int, token: int) -> int | None:
        """The child of `node` (-1: the root) carrying `token`, or None."""
        return next((c for c in self.children[node + 1] if self.tokens[c] == token), None)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for the root, -1)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path as node indices, leaves in node order."""
        return [self.path_to(i) for i in range(len(self)) if not self.children[i + 1]]

    def mask(self, device=None) -> torch.Tensor:
        """[N+1, N+1] bool, +1 layout: entry (i, j) is True when j is i or an ancestor of i."""
        seen: list[list[int]] = []  # per node: +1 indices of the root, its ancestors and itself
        rows, cols = [0], [0]
        for i, parent in enumerate(self.parents):
            seen.append((seen[parent] if parent >= 0 else [0]) + [i + 1])
            rows += [i + 1] * len(seen[i])
            cols += seen[i]
        mask = torch.zeros(len(self) + 1, len(self) + 1, dtype=torch.bool, device=device)
        mask[rows, cols] = True  # one indexed write, not a Python loop of tensor ops per node
        return mask

    def positions(self, length: int, device=None) -> torch.Tensor:
        """[N+1] cache positions of [root, nodes] when the root goes in at `length`."""
        return torch.tensor([0] + self.depth, dtype=torch.long, device=device) + length

    def subset(self, nodes: Iterable[int]) -> "Tree":
        """The tree of the given nodes (ancestor-closed), in their original order."""
        keep = sorted(set(nodes))
        new_index = {old: new for new, old in enumerate(keep)}
        if any(self.parents[i] >= 0 and self.parents[i] not in new_index for i in keep):
            raise ValueError("a subset must contain the ancestors of its nodes")
        return Tree([self.tokens[i] for i in keep], [new_index.get(self.parents[i], -1) for i in keep])

    def up_to_depth(self, max_depth: int) -> list[int]:
        """Indices of the nodes at depth <= max_depth (ancestor-closed, in order)."""
        return [i for i, d in enumerate(self.depth) if d <= max_depth]

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]]) -> "Tree":
        """A trie of candidate continuations: shared prefixes are stored once; siblings in order of
        first appearance."""
        return _Trie().add_all(sequences).tree()

    @classmethod
    def merge(cls, trees: Iterable["Tree"]) -> "Tree":
        """One tree holding every path of the given trees (shared prefixes stored once); the nodes of
        earlier trees come first among siblings."""
        trie = _Trie()
        for tree in trees:
            trie.add_tree(tree)
        return trie.tree()


class _Trie:
    """Builds a Tree node by node; (parent, token) pairs already present are reused."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.index: dict[tuple[int, int], int] = {}

    def add(self, parent: int, token: int) -> int:
        key = (parent, token)
        if key not in self.index:
            self.index[key] = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
        return self.index[key]

    def add_all(self, sequences: Iterable[Sequence[int]]) -> "_Trie":
        for seq in sequences:
            node = -1
            for token in seq:
                node = self.add(node, int(token))
        return self

    def add_tree(self, tree: Tree) -> "_Trie":
        mapped: list[int] = []
        for token, parent in zip(tree.tokens, tree.parents):
            mapped.append(self.add(mapped[parent] if parent >= 0 else -1, token))
        return self

    def tree(self) -> Tree:
        return Tree(list(self.tokens), list(self.parents))


def best_nodes(parents: Sequence[int], scores: Sequence[float], budget: int) -> list[int]:
    """The `budget` nodes with the highest scores, closed under ancestors, in node order.

    scores: e.g. cumulative draft log-probability of each node's path (EAGLE-2), which never grows
    along a path, so the best nodes of a tree are mostly ancestor-closed already; ties and the rare
    exception are resolved by taking a node's missing ancestors with it while the budget lasts."""
    chosen: set[int] = set()
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        if len(chosen) >= budget:
            break
        missing = []
        node = i
        while node >= 0 and node not in chosen:
            missing.append(node)
            node = parents[node]
        if len(chosen) + len(missing) <= budget:
            chosen.update(missing)
    return sorted(chosen)

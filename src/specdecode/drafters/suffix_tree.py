"""Counting suffix tries over token streams: the data structure behind suffix decoding (suffix.py).

A `SuffixTrie` holds every substring of at most `depth` tokens of the streams added to it; a node
counts how many times its substring occurred (so a child's count over its parent's is the empirical
probability of that continuation). Appending a token to a stream costs O(depth): the stream keeps its
"frontier", the nodes of its suffixes of length 1..depth-1, and each moves one token down. Streams
are identified by a key; `remove(key)` subtracts a stream again (eviction), deleting nodes whose
count reaches zero. This is a bounded-depth form of the suffix tree of Oliaro et al. 2024 ("SuffixDecoding",
arXiv 2411.04975): matches and continuations longer than `depth` are not needed for proposals capped
at that depth.

Nodes are ids into flat storage (counts in an array, each node's children an int -> int dict, None
for a leaf) rather than objects: Python's garbage collector walks every container object on a full
collection, and a server's trie of Node objects (one dict each) made those collections stop the whole
process for a noticeable pause, a few times a minute under replayed agentic traffic (docs/drafters.md);
dicts of ints only are not tracked by the collector at all.
"""

from __future__ import annotations

from array import array


class SuffixTrie:
    ROOT = 0

    def __init__(self, depth: int):
        if depth < 2:
            raise ValueError(f"a suffix trie needs depth >= 2, got {depth}")
        self.depth = depth
        self.count = array("q", [0])  # node id -> occurrences of its substring
        self.kids: list[dict[int, int] | None] = [None]  # node id -> {token: child id}, None: none yet
        self.unused: list[int] = []  # ids of pruned nodes, handed out again
        self.streams: dict[object, list[int]] = {}  # key -> its tokens (for removal)
        self.frontier: dict[object, list[int]] = {}  # key -> nodes of its suffixes, shortest first

    @property
    def nodes(self) -> int:
        """Nodes in the trie, the root included."""
        return len(self.count) - len(self.unused)

    def children(self, node: int) -> dict[int, int]:
        """token -> child id of `node` (empty for a leaf; do not modify)."""
        return self.kids[node] or {}

    def extend(self, key, tokens: list[int]) -> None:
        """Append tokens to stream `key` (a new key starts a new stream)."""
        stream = self.streams.setdefault(key, [])
        frontier = self.frontier.setdefault(key, [])
        count, child, keep = self.count, self._child, self.depth - 1
        for t in tokens:
            stream.append(t)
            moved = [child(self.ROOT, t)]
            moved += [child(node, t) for node in frontier[:keep]]
            for node in moved:
                count[node] += 1
            frontier[:] = moved[:keep]  # suffixes of length depth no longer grow

    def remove(self, key) -> None:
        """Subtract stream `key`'s substrings (eviction)."""
        tokens = self.streams.pop(key, [])
        self.frontier.pop(key, None)
        for end in range(len(tokens)):
            self._decrement(tokens[max(0, end - self.depth + 1) : end + 1])

    def match(self, context: list[int], longest: int | None = None) -> tuple[int | None, int]:
        """The node of the longest suffix of `context` (at most `longest`, default depth - 1 tokens)
        that occurs in the trie with a continuation, and that suffix's length (None, 0: no match).
        A match of m tokens leaves depth - m levels of continuation below it."""
        for length in range(min(longest or self.depth - 1, self.depth - 1, len(context)), 0, -1):
            node: int | None = self.ROOT
            for t in context[len(context) - length :]:
                node = self.children(node).get(t)
                if node is None:
                    break
            if node is not None and self.kids[node]:
                return node, length
        return None, 0

    def grow(
        self, node: int, limit: int, min_prob: float, branches: int
    ) -> tuple[list[int], list[int], list[float]]:
        """A token tree below `node`: at most `limit` nodes, best-first by the empirical path
        probability (product of count ratios), keeping nodes whose path probability is at least
        `min_prob`; with branches = 1 a chain (the most frequent child at each step). -> (tokens,
        parents, path probs), parents in the Proposal's convention (-1: a child of the last committed
        token)."""
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        count = self.count
        frontier = [(1.0, -1, node)]  # (path prob, index of the tree node, trie node)
        while frontier and len(tokens) < limit:
            frontier.sort(key=lambda f: -f[0])
            prob, index, trie_node = frontier.pop(0)
            kids = self.children(trie_node)
            total = sum(count[c] for c in kids.values())
            ranked = sorted(kids.items(), key=lambda kv: -count[kv[1]])[:branches]
            for t, child in ranked:
                p = prob * count[child] / total
                if p < min_prob or len(tokens) >= limit:
                    break
                tokens.append(t)
                parents.append(index)
                probs.append(p)
                if self.kids[child]:
                    frontier.append((p, len(tokens) - 1, child))
        return tokens, parents, probs

    def _child(self, node: int, t: int) -> int:
        kids = self.kids[node]
        if kids is None:
            kids = self.kids[node] = {}
        child = kids.get(t)
        if child is None:
            if self.unused:
                child = self.unused.pop()
            else:
                child = len(self.count)
                self.count.append(0)
                self.kids.append(None)
            kids[t] = child
        return child

    def _decrement(self, path: list[int]) -> None:
        """Decrement the end node of each suffix of `path` (the substrings that ended at one position)."""
        for start in range(len(path)):
            node, trail = self.ROOT, []
            for t in path[start:]:
                trail.append((node, t))
                node = self.kids[node][t]
            self.count[node] -= 1
            for parent, t in reversed(trail):  # prune empty leaves upwards
                child = self.kids[parent][t]
                if self.count[child] == 0 and not self.kids[child]:
                    del self.kids[parent][t]
                    if not self.kids[parent]:
                        self.kids[parent] = None
                    self.kids[child] = None
                    self.unused.append(child)
                else:
                    break

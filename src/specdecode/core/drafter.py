"""The drafter protocol: propose up to k tokens for a context, observe how many were accepted.

A drafter that reads the target's hidden states (Medusa, EAGLE) also names the target layers it
needs (`layers`, lm.Output's convention) and receives their rows through `feed`; the others name
none. `fork` is the one way to get a drafter for another request: callers never copy a drafter's
attributes themselves."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specdecode.core.sampling import Warp
from specdecode.core.tree import Tree


@dataclass
class Proposal:
    """A chain of k drafts, or a token tree of k nodes when `parents` is given (see tree.py).

    probs row i is the distribution node i was drawn from, given its path and (in a tree) its earlier
    siblings; None means every token was chosen deterministically (one-hot q, always lossless)."""

    tokens: torch.Tensor  # [k] draft token ids (k may be 0: nothing to propose)
    probs: torch.Tensor | None = None  # [k, V] q after warp, or None for a one-hot drafter
    parents: list[int] | None = None  # [k] tree: parent node of each token, -1 = the last committed token
    confidence: list[float] | None = None  # [k] the drafter's P(node's path is accepted), None: no estimate

    @classmethod
    def empty(cls) -> "Proposal":
        return cls(torch.empty(0, dtype=torch.long))

    @classmethod
    def of_tree(
        cls, tree: Tree, probs: torch.Tensor | None = None, confidence: list[float] | None = None
    ) -> "Proposal":
        """A tree proposal; a tree that is a chain becomes a chain proposal (the decoder's plain path)."""
        parents = None if tree.is_chain else list(tree.parents)
        return cls(torch.tensor(tree.tokens, dtype=torch.long), probs, parents, confidence)

    def tree(self) -> Tree:
        """The proposal as a tree (a chain is the degenerate tree)."""
        tokens = self.tokens.tolist()
        return Tree.chain(tokens) if self.parents is None else Tree(tokens, list(self.parents))


class Drafter(Protocol):
    """What the decoder, the batched core, the server and the benchmark may ask of a drafter. A drafter
    class subclasses it (explicitly) and inherits these defaults: no features, nothing to forget at
    begin, no feedback, a fork that shares everything."""

    name: str
    layers: tuple[
        int, ...
    ] = ()  # target layers whose hidden rows this drafter reads (lm.Output's convention)

    def begin(self, prompt: list[int]) -> None:
        """A new request starts with these prompt tokens."""

    def propose(
        self, context: list[int], k: int, params: Warp, generator: torch.Generator | None
    ) -> Proposal:
        """Propose at most k tokens to follow `context` (every committed token so far); a tree
        proposal may hold more nodes, at most k deep (the decoder drops deeper ones)."""
        raise NotImplementedError

    def observe(self, drafted: int, accepted: int) -> None:
        """Feedback after verification: `accepted` of the `drafted` tokens were kept."""

    def feed(self, features: torch.Tensor) -> None:
        """Only for drafters with `layers`: features [m, len(layers) * H] of the next m committed
        positions: the prompt's but the last token's after prefill, then after each step the last
        committed token's and the accepted drafts' (the rows that stay in the target's cache)."""
        raise TypeError(f"drafter {self.name} reads no target features")

    def fork(self, learned: Learned | None = None) -> "Drafter":
        """A drafter for one more request (the batched core's sequences, the server's requests, the
        benchmark's rows): weights, prepacked heads and read-only corpora shared; state that begin()
        does not reset (a draft model's KV cache) its own. learned: for a drafter that learns from
        earlier responses (Kind.learns), maps its store of them to the one the copy uses (the server:
        the store of the request's scope, bench's rows included); None: shared."""
        return copy.copy(self)


Learned = Callable[[Any], Any]  # a learning drafter's store of earlier responses -> the store a fork uses


def feed_members(members: list[Drafter], features: torch.Tensor) -> None:
    """A composite drafter's feed: features [m, sum of members' len(layers) * H], the members' layers
    in order; each feature-reading member gets its own columns."""
    width = features.shape[1] // sum(len(m.layers) for m in members)
    start = 0
    for member in members:
        if n := len(member.layers):
            member.feed(features[:, start : start + n * width])
            start += n * width

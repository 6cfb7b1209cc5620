"""`ngram`: prompt/output lookup. Match the last n tokens earlier in the context (n from max_n
down to min_n) and propose what followed the most recent match. No weights, one-hot q.
(The idea of prompt lookup decoding: Saxena 2023; vLLM's `ngram` proposer.)

With `branches` b > 1 it proposes a token tree: up to b distinct continuations, the longest match
first and, among equally long matches, the most recent first (a match whose continuation adds
nothing to the tree does not count). The target checks them all in one forward.

With `stop=P` (or `stop=auto`) a chain keeps a token while its odds of surviving verification pay
for its row (chain_stop.py: P percent, or the row's measured price). Lookup has no probabilities of
its own, so the odds are this request's own record: a_i, the share of chains that reached position i
whose token i was accepted (with one accepted and one rejected try as a prior), multiplied along the
chain. Where rows are dear (AVX2: 0.2-0.45 of a 1.5B step) a request whose lookups keep failing
proposes short chains or none, so `fallback:` hands its steps to the next member; where rows are
nearly free the chain is hardly cut.
Which tokens are proposed changes, never what is emitted.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from specdecode.core.drafter import Drafter, Proposal
from specdecode.core.tree import Tree
from specdecode.drafters.chain_stop import ChainStop
from specdecode.errors import UserError

_MAX_HITS = 64  # matches examined per n when collecting several continuations


def lookup(context: np.ndarray, k: int, max_n: int, min_n: int) -> np.ndarray:
    """context: [L] -> up to k tokens that followed the latest earlier match of its last n tokens."""
    found = lookup_all(context, k, max_n, min_n, 1)
    return found[0] if found else context[:0]


def lookup_all(context: np.ndarray, k: int, max_n: int, min_n: int, limit: int) -> list[np.ndarray]:
    """context: [L] -> up to `limit` continuations [<= k] of matches of its suffix, each adding at
    least one token sequence the earlier ones do not start with; longest n first, then most recent."""
    length = context.shape[0]
    found: list[np.ndarray] = []
    seen: set[tuple[int, ...]] = set()  # every prefix of a continuation already found
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = sliding_window_view(context[: length - 1], n)  # [L-n, n], starts 0..L-n-1
        hits = np.flatnonzero((windows == context[length - n :]).all(axis=1))
        for start in hits[::-1][:_MAX_HITS] + n:
            continuation = context[start : start + k]
            key = tuple(continuation.tolist())
            if not key or key in seen:
                continue
            found.append(continuation)
            seen.update(key[:i] for i in range(1, len(key) + 1))
            if len(found) >= limit:
                return found
    return found


MIN_N, MAX_N = 2, 4  # the n-gram lengths tried when the spec names none


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(
        self, max_n: int = MAX_N, min_n: int = MIN_N, branches: int = 1, stop: float | ChainStop = 0.0
    ):
        """stop: keep a chain's tokens while their survival odds (this request's acceptance per
        position) are at least this, or pay their rows (a ChainStop); 0: never stop."""
        if not 1 <= min_n <= max_n:
            raise UserError(f"ngram needs 1 <= min_n <= max_n, got min_n={min_n} max_n={max_n}")
        if branches < 1:
            raise UserError(f"ngram needs b >= 1 branches, got {branches}")
        self.max_n, self.min_n, self.branches = max_n, min_n, branches
        self.stop = ChainStop.of(stop)
        self.record = Record()

    def begin(self, prompt):
        self.record = Record()  # a fork shares the parent's until then

    def observe(self, drafted, accepted):
        self.record.observe(drafted, accepted)

    def propose(self, context, k, params, generator):
        context = np.asarray(context, dtype=np.int64)
        if self.branches == 1:
            chain = lookup(context, k, self.max_n, self.min_n)
            if self.stop.active and len(chain):
                chain = chain[: self.record.worth(self.stop.bars(len(chain))[0])]
            return Proposal(torch.from_numpy(chain.copy()))
        found = lookup_all(context, k, self.max_n, self.min_n, self.branches)
        return Proposal.of_tree(Tree.from_sequences(seq.tolist() for seq in found))


class Record:
    """A request's chains so far: reached[i] chains offered a token at position i after accepted ones
    before it, kept[i] of those had it accepted."""

    def __init__(self):
        self.reached: list[int] = []
        self.kept: list[int] = []

    def observe(self, drafted: int, accepted: int) -> None:
        for i in range(min(drafted, accepted + 1)):  # positions past the first rejection were not tried
            if i == len(self.reached):
                self.reached.append(0)
                self.kept.append(0)
            self.reached[i] += 1
            self.kept[i] += i < accepted

    def worth(self, keep: list[float]) -> int:
        """How many of a chain's first len(keep) tokens to propose: while their survival odds, the
        product of (kept + 1) / (reached + 2) along the chain, stay at or above keep[i]."""
        odds = 1.0
        for i, stop in enumerate(keep):
            kept, reached = (self.kept[i], self.reached[i]) if i < len(self.reached) else (0, 0)
            odds *= (kept + 1) / (reached + 2)
            if odds < stop:
                return i
        return len(keep)

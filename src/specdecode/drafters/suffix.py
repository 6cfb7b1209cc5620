"""`suffix[:key=value...]`: suffix decoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative
Decoding for Emerging AI Applications", arXiv 2411.04975; vLLM's `method: "suffix"`).

Two counting suffix tries (suffix_tree.py): one over this request's prompt and generated tokens, and
one shared `SuffixCache` over the responses of previous requests (at most `max_cached_requests`,
oldest evicted). Each step matches the longest recent pattern of the context in both, grows a
token tree (or, with tree=0, a chain) from the continuations by their empirical probabilities,
keeping nodes at least `min_token_prob` likely, and proposes the better-scoring of the two (score:
the expected accepted tokens, the sum of path probabilities). Speculation length adapts to the match:
at most `max_spec_factor` × the matched length, and at most `max_tree_depth`. No match: no drafts.
q is one-hot (tokens chosen deterministically), so verification stays lossless.
A third, read-only trie may hold a corpus (`suffix:...:PATH`, a `train data` directory or a JSONL of
responses): the target's own past answers to other prompts, looked up like the cache (retrieval-based
drafting, REST: He et al. 2024, arXiv 2311.08252). It is built once and shared by every copy.
Options mirror vLLM's: max_tree_depth 24, max_cached_requests 10000, max_spec_factor 1.0,
min_token_prob 0.1; plus tree (1: token trees, 0: chains), b (branches per node, trees only) and
min_match (default 2: a pattern of one token proposes nothing; on held-out prose such proposals were
rarely accepted and made suffix slower than plain decoding on writing:
docs/results/suffix_heldout2_min_match_3runs_2threads.json).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from pathlib import Path

import torch

from specdecode import shards
from specdecode.core.drafter import Drafter, Learned, Proposal
from specdecode.core.sampling import Warp
from specdecode.corpora import jsonl_rows
from specdecode.drafters.suffix_tree import SuffixTrie
from specdecode.errors import UserError

DEFAULTS = {
    "max_tree_depth": 24,
    "max_cached_requests": 10000,
    "max_spec_factor": 1.0,
    "min_token_prob": 0.1,
    "tree": 1,
    "b": 4,
    "min_match": 2,
}


class SuffixCache:
    """The global trie over previous responses, bounded by the number of responses it holds."""

    def __init__(self, max_tree_depth: int = 24, max_cached_requests: int = 10000):
        self.trie = SuffixTrie(max_tree_depth)
        self.max_requests = max_cached_requests
        self.order: OrderedDict[object, None] = OrderedDict()
        self.ids = itertools.count()

    def new_key(self) -> int:
        return next(self.ids)

    def extend(self, key, tokens: list[int]) -> None:
        """Add tokens to response `key` (a new key is a new response; the oldest ones are evicted)."""
        if self.max_requests == 0 or not tokens:
            return
        if key not in self.order:
            self.order[key] = None
            while len(self.order) > self.max_requests:
                self.trie.remove(self.order.popitem(last=False)[0])
        self.trie.extend(key, tokens)

    def responses(self) -> list[list[int]]:
        return [self.trie.streams[key] for key in self.order]

    @property
    def nodes(self) -> int:
        return self.trie.nodes


class Corpus:
    """A read-only suffix trie over a corpus of responses: shared by every fork of its drafter."""

    def __init__(self, responses: list[list[int]], depth: int):
        self.trie = SuffixTrie(depth)
        for i, tokens in enumerate(responses):
            self.trie.extend(i, tokens)
        self.trie.streams.clear()  # never removed from: the frontiers and stream copies only cost memory
        self.trie.frontier.clear()


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(
        self,
        cache: SuffixCache | None = None,
        max_tree_depth: int = 24,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        tree: bool = True,
        branches: int = 4,
        min_match: int = 2,
        corpus: Corpus | None = None,
    ):
        self.cache = cache if cache is not None else SuffixCache(max_tree_depth)
        self.corpus = corpus
        self.depth, self.factor, self.min_prob = max_tree_depth, max_spec_factor, min_token_prob
        self.branches = branches if tree else 1
        self.min_match = min_match
        self.local: SuffixTrie | None = None
        self.key = None
        self.seen = 0  # context tokens already added to the tries
        self.prompt_len = 0

    def begin(self, prompt: list[int]) -> None:
        self.local = SuffixTrie(self.depth)
        self.local.extend(0, prompt)
        self.key = self.cache.new_key()
        self.seen = self.prompt_len = len(prompt)

    def propose(
        self, context: list[int], k: int, params: Warp, generator: torch.Generator | None
    ) -> Proposal:
        """context: every committed token -> up to k tokens (a tree: nodes at most k deep)."""
        if self.local is None:
            self.begin(context)
        new = context[self.seen :]
        self.local.extend(0, new)
        self.cache.extend(self.key, new)  # this response so far, for later requests (and this one)
        self.seen = len(context)
        best: tuple[float, list[int], list[int], list[float]] = (0.0, [], [], [])
        # the trie holds pattern + continuation within `depth` tokens: a match of m leaves depth - m to
        # speculate, and factor * m are wanted, so matches longer than depth / (1 + factor) only cost
        longest = max(1, round(self.depth / (1 + self.factor)))
        for trie in (self.local, self.cache.trie, *([self.corpus.trie] if self.corpus else [])):
            node, length = trie.match(context, longest)
            if node is None or length < self.min_match:
                continue
            limit = min(k, max(1, int(self.factor * length)))  # nodes, hence also depth <= k
            tokens, parents, probs = trie.grow(node, limit, self.min_prob, self.branches)
            if sum(probs) > best[0]:
                best = (sum(probs), tokens, parents, probs)
        _, tokens, parents, probs = best
        if not tokens:
            return Proposal.empty()
        chain = all(p == i - 1 for i, p in enumerate(parents))
        # a tree ranks its nodes by their empirical path probabilities: an adaptive policy verifies
        # the most probable ones its measured costs pay for (core.plan.plan, control.AdaptiveK.tree_nodes)
        return Proposal(torch.tensor(tokens, dtype=torch.long), None, None if chain else parents, probs)

    def fork(self, learned: Learned | None = None) -> "SuffixDrafter":
        """A copy with the response cache `learned(cache)` (None: this one's, shared); the corpus is
        shared."""
        twin = super().fork()
        twin.cache = self.cache if learned is None else learned(self.cache)
        twin.local, twin.key = None, None
        return twin


def read_responses(path: str, tokenizer) -> list[list[int]]:
    """Past responses as token ids: a `train data` directory, or JSONL with response_ids / response
    (the server's `--suffix-warm`, a `suffix:...:PATH` corpus)."""
    p = Path(path)
    if p.is_dir():  # written by `train data`: shards, and sequences.jsonl in older directories
        out = [s.response_ids for s in shards.read_all(p)]
        legacy = p / "sequences.jsonl"
        return out + (read_responses(str(legacy), tokenizer) if legacy.is_file() else [])
    if not p.is_file():
        raise UserError(f"past responses: {path} is neither a `train data` directory nor a JSONL file")
    out = []
    for lineno, row in jsonl_rows(p, "past responses"):
        if isinstance(row.get("response_ids"), list):
            out.append([int(t) for t in row["response_ids"]])
        elif isinstance(row.get("response"), str):
            out.append(tokenizer(row["response"], add_special_tokens=False)["input_ids"])
        else:
            raise UserError(f"{path}:{lineno}: expected 'response_ids' or 'response'")
    return out

"""Greedy acceptance of weightless drafters (prompt lookup, suffix decoding with a corpus) replayed on
held-out responses, without running the target: a response in a `train data` directory is the target's
greedy output, so the tokens a lookup drafter would have had accepted are the matching prefix of its
proposal and the response's next tokens. Each prompt starts with an empty shared cache (nothing
learned from the evaluation responses); the corpus holds the first `--corpus-tokens` response tokens
of the data, the evaluation samples later ones.

    python3 scripts/lookup_acceptance.py DATA_DIR [DATA_DIR ...] --corpus-tokens N [--sample 150]
        [--drafters ngram,suffix:tree=0:max_tree_depth=8] [--k 4] [--max-new-tokens 64]

Prints per drafter: tokens per target step and draft tokens per step (a drafter spec without a PATH
gets the corpus when it is a suffix spec).
"""

from __future__ import annotations

import argparse
import random

from specdecode import drafters
from specdecode.core.sampling import Warp
from specdecode.drafters.suffix import Corpus
from specdecode.train import data


def replay(make, seqs, k: int, max_new_tokens: int) -> tuple[float, float]:
    """make() -> a fresh drafter (one per response) -> (tokens per target step, draft tokens per step)
    on the sequences' responses."""
    steps = tokens = drafted = 0
    for s in seqs:
        drafter = make()
        drafter.begin(list(s.prompt_ids))
        response, i = s.response_ids[:max_new_tokens], 0
        while i < len(response):
            proposal = drafter.propose(list(s.prompt_ids) + response[:i], k, Warp(), None).tokens.tolist()
            accepted = next(
                (j for j, (t, want) in enumerate(zip(proposal, response[i:])) if t != want),
                min(len(proposal), len(response) - i),
            )
            step = min(accepted + 1, len(response) - i)
            steps, tokens, drafted, i = steps + 1, tokens + step, drafted + len(proposal), i + step
    return tokens / steps, drafted / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+")
    ap.add_argument("--corpus-tokens", type=int, required=True)
    ap.add_argument("--sample", type=int, default=150)
    ap.add_argument("--drafters", default="ngram,suffix:tree=0:max_tree_depth=8")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    seqs = [s for d in args.data for s in data.read(d)]
    head, count = [], 0
    for s in seqs:
        if count >= args.corpus_tokens:
            break
        head.append(s)
        count += len(s.response_ids)
    rest = seqs[len(head) :]
    held = random.Random(args.seed).sample(rest, min(args.sample, len(rest)))
    print(f"corpus: {len(head)} responses, {count} tokens; replayed: {len(held)} later responses")
    corpora: dict[int, Corpus] = {}  # by trie depth
    for text in args.drafters.split(","):
        spec = drafters.parse(text)
        if not spec.weightless:
            raise SystemExit(f"{text}: only weightless drafters replay without the target")

        def make(spec=spec):
            drafter = spec.info.build(spec, None)
            if hasattr(drafter, "corpus"):  # suffix decoding: the corpus of earlier responses
                depth = drafter.depth
                drafter.corpus = corpora.get(depth) or corpora.setdefault(
                    depth, Corpus([s.response_ids for s in head], depth)
                )
            return drafter

        per_step, width = replay(make, held, args.k, args.max_new_tokens)
        print(f"{text}: {per_step:.3f} tokens per target step, {width:.2f} draft tokens per step")


if __name__ == "__main__":
    main()

"""Speculation under load: how much k is worth at the current batch size, from measured costs.

T(B, n) is the time of one batched target forward over B rows of n tokens each, measured at
start-up for B in 1, 2, 4, ... max_batch and n in 1..k_max+1, then refreshed from the engine's own
steps (EWMA). At batch B the verify cost ratio r_B(k) = T(B, k+1) / T(B, 1) feeds the same cost
model as single-request adaptive k (control.CostModel, best_k): on a CPU a lone row verifies 5
tokens for little more than one, but B rows of 5 tokens cost nearly 5x B rows of one, so at large B
the best k shrinks, down to 0 (no speculation) when acceptance is low.
"""

from __future__ import annotations

import statistics
import time

import torch

from specdecode.backends.batch_model import BatchLM, Row
from specdecode.decoding.control import CostModel, best_k


class BatchCosts:
    def __init__(self, times: dict[tuple[int, int], float], weight: float = 0.05):
        self.times = dict(times)  # (B, n) -> seconds
        self.weight = weight

    def _at(self, b: int, n: int) -> float | None:
        sizes = sorted({size for size, _ in self.times})
        if not sizes:
            return None
        size = next((s for s in sizes if s >= b), sizes[-1])  # nearest measured batch size at or above b
        ns = sorted(m for s, m in self.times if s == size)
        m = next((x for x in ns if x >= n), ns[-1])
        t = self.times[(size, m)]
        return t * n / m if n > m else t  # beyond the measured range: linear in tokens

    def cost(self, b: int, draft_s_per_token: float = 0.0, k_max: int = 8) -> CostModel:
        """The cost model of one request at batch size b (ratios relative to T(b, 1))."""
        t1 = self._at(b, 1)
        if not t1:
            return CostModel(0.0, {}, 0.0)
        ratios = monotone([max(1.0, self._at(b, k + 1) / t1) for k in range(1, k_max + 1)])
        return CostModel(draft_s_per_token / t1, dict(zip(range(1, k_max + 1), ratios)), t1)

    def rows(self) -> list[float]:
        """One sequence's verify cost ratios [r(0) = 1, r(1), ..., r(K)] as they stand now (a drafter's
        stop=auto prices its chain's rows by them: drafters/chain_stop.py)."""
        k_max = max(n for b, n in self.times if b == 1) - 1
        cost = self.cost(1, 0.0, k_max)
        return [1.0] + [cost.r(k) for k in range(1, k_max + 1)]

    def cap(self, b: int, profile: list[float], k_max: int, draft_s_per_token: float = 0.0) -> int:
        """The best k at batch size b for a drafter with this conditional acceptance profile."""
        if b <= 1 or not profile:
            return k_max
        return best_k(profile, self.cost(b, draft_s_per_token, k_max), k_max)[0]

    def observe(self, b: int, n: int, seconds: float) -> None:
        key = (b, n)
        old = self.times.get(key)
        self.times[key] = seconds if old is None else (1 - self.weight) * old + self.weight * seconds


def batch_sizes(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


def measure(model: BatchLM, max_batch: int, k_max: int, context: int = 32, repeats: int = 3) -> BatchCosts:
    """Time B rows x n tokens after a `context`-token prefix, for B in batch_sizes, n in 1..k_max+1.
    Uses slots 0..max_batch-1 and leaves them empty."""
    context = max(1, min(context, model.max_length - k_max - 2))
    prefix = torch.arange(context, dtype=torch.long) % model.vocab_size
    model.forward([Row(s, prefix, num_logits=1) for s in range(max_batch)])
    times = {}
    for b in batch_sizes(max_batch):
        for n in range(1, k_max + 2):
            rows = [Row(s, prefix[:n]) for s in range(b)]
            samples = []
            for i in range(repeats + 1):
                t0 = time.perf_counter()
                model.forward(rows)
                if i:  # the first run is a warm-up
                    samples.append(time.perf_counter() - t0)
                for s in range(b):
                    model.truncate(s, context)
            times[(b, n)] = statistics.median(samples)
    for s in range(max_batch):
        model.truncate(s, 0)
    return BatchCosts(times)


def monotone(values: list[float]) -> list[float]:
    """The closest non-decreasing sequence (least squares, pool-adjacent-violators). A forward over
    more tokens never costs less; single timings on a shared machine often say otherwise, and an
    unsmoothed dip at some k would make the controller prefer that k for no real reason."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(n)]

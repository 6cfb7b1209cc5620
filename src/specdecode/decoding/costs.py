"""Measuring the cost model: T(n), the time of one target forward over n new tokens, and the
drafter's time per drafted token, both relative to one plain decoding step T(1).
"""

from __future__ import annotations

import statistics
import time

import torch

from specdecode.backends.lm import CausalLM
from specdecode.core.drafter import Drafter
from specdecode.core.sampling import Warp
from specdecode.decoding.control import CostModel


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(
    target: CausalLM,
    drafter: Drafter,
    k_max: int,
    context: list[int],
    params: Warp = Warp(),
    repeats: int = 7,
) -> CostModel:
    """Time the target on 1..k_max+1 tokens after `context`, and the drafter proposing k_max."""
    layers = drafter.layers
    target.reset()
    prefill = target.forward(torch.tensor(context[:-1]), num_logits=1, layers=layers)
    base = target.length
    step = torch.tensor(context[-1:] * (k_max + 1))

    def forward(n):
        target.extend(step[:n])
        target.truncate(base)

    sizes = range(1, k_max + 2)
    for n in sizes:  # warm-up: first calls at a new size pay one-off kernel set-up
        forward(n)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):  # sizes interleaved, so a slow phase of a shared machine hits all alike
        for n in sizes:
            t0 = time.perf_counter()
            forward(n)
            samples[n].append(time.perf_counter() - t0)
    t = {n: statistics.median(v) for n, v in samples.items()}
    drafter.begin(context)
    if layers:
        drafter.feed(prefill.features)
    generator = torch.Generator().manual_seed(0)
    draft_s = _median_time(lambda: drafter.propose(context, k_max, params, generator), repeats)
    ratios = monotone([max(1.0, t[k + 1] / t[1]) for k in range(1, k_max + 1)])
    return CostModel(draft_s / k_max / t[1], {k: r for k, r in zip(range(1, k_max + 1), ratios)}, t[1])


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


class CostTracker:
    """Refreshes a cost model online from the decoder's own step timings (EWMA per size)."""

    def __init__(self, model: CostModel, weight: float = 0.1):
        self.model, self.weight = model, weight
        self.step_s = {1: model.step_s}

    def observe(self, drafted: int, draft_s: float, verify_s: float) -> None:
        n, w = drafted + 1, self.weight
        self.step_s[n] = verify_s if n not in self.step_s else (1 - w) * self.step_s[n] + w * verify_s
        if n == 1:
            self.model.step_s = self.step_s[1]
        elif 1 in self.step_s:
            r = self.step_s[n] / self.step_s[1]
            old = self.model.verify_ratio.get(drafted, r)
            self.model.verify_ratio[drafted] = (1 - w) * old + w * r
            c = draft_s / drafted / self.step_s[1]
            self.model.draft_cost = (1 - w) * self.model.draft_cost + w * c

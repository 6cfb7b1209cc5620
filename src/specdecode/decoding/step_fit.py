"""The cost model of a serving engine fitted from its own step times, so that k is chosen with the
costs of the engine that will run it (vLLM's scheduler, sampler and proposer launches included),
not with ours.

Input: for a few settings of k, the mean wall time of one decoding step (vLLM's inter-token latency:
one observation per step and request) and the mean number of tokens drafted per step, n (k for
fixed-length drafters, less for n-gram or suffix drafts). Model: a step costs

    T(n) = T0 + t·n          T0: the step without drafts (≈ T(1), one plain forward),
                             t: one more token drafted and verified

so, relative to T0, c = t / T0 per drafted token and r(n) = 1 in control.CostModel; speedup(k) =
E(k) / (1 + c·k) and tokens per second E(k) / T(k). Step times alone cannot tell drafting from
verifying (both grow with n): the whole slope is charged to c. That leaves the predicted cost of
every chain of k drafts, all that choosing k needs, unchanged; only token trees (control.tree_nodes
prices nodes with r) would need the split.

The line is fitted by Theil-Sen (the median of the slopes between all pairs of points at different
n, then the median intercept): on a shared machine one measurement slowed by another process moves
a least-squares line, not a median one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import combinations

from specdecode.decoding.control import CostModel
from specdecode.errors import UserError


@dataclass(frozen=True)
class StepTiming:
    draft_tokens: float  # n: mean tokens drafted per step at this setting (0: plain decoding)
    step_s: float  # mean seconds per decoding step
    steps: float = 0.0  # how many steps the mean is over (reported, not weighted: medians ignore it)

    def to_json(self) -> dict:
        return {"draft_tokens": round(self.draft_tokens, 3), "step_s": self.step_s, "steps": self.steps}


@dataclass(frozen=True)
class StepFit:
    base_s: float  # T0, seconds of a step without drafts
    per_token_s: float  # t, seconds per drafted (and verified) token

    def step_s(self, n: float) -> float:
        return self.base_s + self.per_token_s * n

    def cost_model(self) -> CostModel:
        return CostModel(self.per_token_s / self.base_s, {}, self.base_s)

    def to_json(self) -> dict:
        return {
            "base_s": round(self.base_s, 6),
            "per_token_s": round(self.per_token_s, 6),
            "draft_cost": round(self.per_token_s / self.base_s, 4),
        }


def fit_step_costs(timings: list[StepTiming]) -> StepFit:
    """Step times at two or more draft lengths -> T(n) = T0 + t·n (Theil-Sen; t >= 0, T0 > 0)."""
    if any(not (t.step_s > 0) or t.draft_tokens < 0 for t in timings):
        raise UserError("step timings need positive step times and draft lengths >= 0")
    slopes = [
        (b.step_s - a.step_s) / (b.draft_tokens - a.draft_tokens)
        for a, b in combinations(timings, 2)
        if abs(b.draft_tokens - a.draft_tokens) > 1e-9
    ]
    if not slopes:
        raise UserError(
            "fitting step costs needs step times at two or more draft lengths (runs at different k)"
        )
    slope = max(0.0, statistics.median(slopes))  # a step never gets cheaper with more tokens
    base = statistics.median(t.step_s - slope * t.draft_tokens for t in timings)
    if base <= 0:
        raise UserError(
            f"the fitted step time without drafts is {base:.4g} s: the step times are inconsistent"
        )
    return StepFit(base, slope)

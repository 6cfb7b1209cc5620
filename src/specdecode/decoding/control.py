"""Choosing k: a measured cost model, a live acceptance estimate, fallback to plain decoding
with re-probing. Pure arithmetic plus one small stateful controller the decoder consults.

Speedup model (Leviathan et al. 2023, §3.4, generalised to a measured verify cost): with draft
cost c per drafted token and verify cost ratio r(k) = T(k+1)/T(1), both relative to one plain
target forward T(1), and E(k) the expected tokens committed per step,

    predicted speedup(k) = E(k) / (k·c + r(k)),      E(k) = (1 - α^(k+1)) / (1 - α)

or, with a per-position acceptance profile a_i (P(draft i accepted | drafts < i accepted)),
E(k) = 1 + Σ_{i=1..k} Π_{j<=i} a_j. k = 0 is plain decoding, speedup 1 by definition.

Drafters such as n-gram lookup often offer fewer than k tokens (or none: the step is a plain one).
With a supply profile s_i = P(drafter offers token i | it offered i-1) and D the tokens offered,
a step drafts min(D, k) tokens, so

    E(k) = 1 + Σ_{i=1..k} Π_{j<=i} s_j·a_j,      cost(k) = Σ_n P(min(D, k) = n)·(n·c + r(n)).

Asking such a drafter for a large k is cheap when it rarely has that much to offer; ignoring supply
makes the controller choose too small a k (measured: fixed k=8 beat a supply-blind controller).

Token trees: a tree's nodes are not a chain's positions, but the same ratio applies. With p_v the
probability that node v lies on the accepted path, E(tree) = 1 + Σ_v p_v, and verifying n nodes costs
r(n). A drafter that ranks its nodes (EAGLE-2's dynamic trees) gives p_v ≈ its path probability; the
adaptive policy scales those by this request's measured calibration (accepted path length / Σ p_v
over the trees it verified) and keeps the n best nodes maximising E(n) / (drafting + r(n)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


def expected_tokens(alpha: float, k: int) -> float:
    """E(α, k): expected tokens per verify step with i.i.d. acceptance α and k drafts."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass
class CostModel:
    draft_cost: float  # c: time of one drafted token / T(1)
    verify_ratio: dict[int, float]  # k -> r(k) = T(k+1) / T(1); r(0) = 1
    step_s: float = 0.0  # T(1), seconds of one plain decoding step (for reports)

    def to_json(self) -> dict:
        return {
            "draft_cost": self.draft_cost,
            "verify_ratio": {str(k): v for k, v in self.verify_ratio.items()},
            "step_s": self.step_s,
        }

    @classmethod
    def from_json(cls, obj: dict) -> "CostModel":
        return cls(
            float(obj["draft_cost"]),
            {int(k): float(v) for k, v in obj["verify_ratio"].items()},
            float(obj.get("step_s", 0.0)),
        )

    def r(self, k: int) -> float:
        if k <= 0:
            return 1.0
        if k in self.verify_ratio:
            return self.verify_ratio[k]
        known = sorted(self.verify_ratio)
        if not known:
            return 1.0
        lo = max([x for x in known if x < k], default=None)
        hi = min([x for x in known if x > k], default=None)
        if lo is None:
            return self.verify_ratio[hi]
        if hi is None:  # extrapolate with the slope of the last two points (or flat)
            if len(known) < 2:
                return self.verify_ratio[lo]
            a, b = known[-2], known[-1]
            slope = (self.verify_ratio[b] - self.verify_ratio[a]) / (b - a)
            return self.verify_ratio[lo] + slope * (k - lo)
        w = (k - lo) / (hi - lo)
        return self.verify_ratio[lo] * (1 - w) + self.verify_ratio[hi] * w


def _at(profile: list[float] | None, i: int, default: float) -> float:
    return profile[min(i, len(profile) - 1)] if profile else default


def speedup(expected: float, p_drafted: list[float], cost: CostModel) -> float:
    """The speedup formula (the module docstring's), the one every estimate uses: E / cost, with
    E the expected tokens committed per step and cost = Σ_n P(a step drafts n)·(n·c + r(n)) in plain
    steps. p_drafted[n] = P(a step drafts exactly n tokens)."""
    return expected / sum(p * (n * cost.draft_cost + cost.r(n)) for n, p in enumerate(p_drafted))


def predicted_speedup(
    accept: list[float], cost: CostModel, k: int, supply: list[float] | None = None
) -> float:
    """E(k) / cost(k) with per-position acceptance and (optionally) supply; supply None = always k drafts."""
    if k <= 0:
        return 1.0
    expected, offered, reach = 1.0, 1.0, 1.0  # offered = P(D >= n), reach = P(n drafts accepted)
    exactly = []  # P(D = n)
    for n in range(k):
        more = offered * _at(supply, n, 1.0)
        exactly.append(offered - more)
        offered = more
        reach *= _at(supply, n, 1.0) * _at(accept, n, 0.0)
        expected += reach
    return speedup(expected, exactly + [offered], cost)


def best_k(
    profile: list[float], cost: CostModel, k_max: int, supply: list[float] | None = None
) -> tuple[int, float]:
    """The k in 0..k_max maximising predicted speedup -> (k, predicted speedup)."""
    options = [(predicted_speedup(profile, cost, k, supply), -k) for k in range(k_max + 1)]
    speed, neg_k = max(options)
    return -neg_k, speed


class KPolicy(Protocol):
    def next_k(self) -> int:
        """How many tokens to draft at the next step (0 = a plain decoding step)."""

    def tree_nodes(self, confidence: list[float]) -> int:
        """How many of a proposed tree's nodes to verify, given the drafter's confidence per node."""

    def observe(self, step) -> None:
        """Feedback from the step just verified (a decoder.Step: drafted, accepted, timings)."""


class FixedK:
    """Always the same k (the --k flag), and every node of a tree."""

    def __init__(self, k: int):
        self.k = k

    def next_k(self) -> int:
        return self.k

    def tree_nodes(self, confidence: list[float]) -> int:
        return len(confidence)

    def observe(self, step) -> None:
        pass


DEFAULT_PRIOR = (0.5,)  # acceptance assumed at every draft position before anything is measured


def adaptive_k(cost: CostModel, k_max: int, history: list[float] | None = None) -> "AdaptiveK":
    """The one way the engine makes an AdaptiveK: its prior is the measured per-position
    (conditional) acceptance `history` of this drafter and task when there is one, else
    DEFAULT_PRIOR."""
    return AdaptiveK(cost, k_max, prior=list(history or DEFAULT_PRIOR))


@dataclass
class AdaptiveK:
    """Per-request k from a running per-position acceptance estimate and the cost model.

    Acceptance at draft position i is estimated as the conditional rate P(accept i | accepted < i),
    from exponentially decayed counts shrunk (with `prior_weight` pseudo-counts) towards `prior[i]`
    (e.g. the task's history) or, past the prior's length, towards the estimate of position i-1, so
    that positions never drafted yet inherit their neighbour's rate instead of a fixed guess. The
    drafter's supply (how often it offers token i given it offered i-1, when asked for more) is
    estimated the same way, from a prior of 1 (a draft model always offers k). When no k
    beats plain decoding by `margin`, it decodes plainly for `backoff` steps and then probes with
    `probe_k` drafts for one step; each failed probe doubles the backoff (up to `max_backoff`), a
    successful one resets it. Hysteresis: speculation restarts only above 1 + margin and stops
    only below 1 - margin.
    """

    cost: CostModel
    k_max: int
    prior: list[float] = field(default_factory=lambda: list(DEFAULT_PRIOR))
    prior_weight: float = 1.0
    decay: float = 0.85
    margin: float = 0.03
    min_backoff: int = 8
    max_backoff: int = 256
    probe_k: int = 2
    trials: list[float] = field(init=False)
    hits: list[float] = field(init=False)
    asked: list[float] = field(init=False)  # decayed counts for supply: position i was asked for ...
    offered: list[float] = field(init=False)  # ... and the drafter offered it
    speculating: bool = field(init=False, default=True)
    wait: int = field(init=False, default=0)
    backoff: int = field(init=False, default=0)
    last_k: int = field(init=False, default=0)
    tree_hits: float = field(init=False, default=0.0)  # decayed accepted path lengths of verified trees ...
    tree_expected: float = field(init=False, default=0.0)  # ... and the drafter's Σ confidence over them
    pending: float | None = field(init=False, default=None)  # Σ confidence of the tree now being verified

    def __post_init__(self):
        self.trials, self.hits, self.asked, self.offered = ([0.0] * self.k_max for _ in range(4))
        self.backoff = self.min_backoff

    def _shrunk(
        self, hits: list[float], trials: list[float], prior: list[float], first: float
    ) -> list[float]:
        out: list[float] = []
        for i in range(self.k_max):
            target = prior[i] if i < len(prior) else (out[-1] if out else first)
            out.append((hits[i] + self.prior_weight * target) / (trials[i] + self.prior_weight))
        return out

    def profile(self) -> list[float]:
        return self._shrunk(self.hits, self.trials, self.prior, 0.5)

    def supply(self) -> list[float]:
        return self._shrunk(self.offered, self.asked, [], 1.0)

    def next_k(self) -> int:
        k, speed = best_k(self.profile(), self.cost, self.k_max, self.supply())
        if self.speculating:
            if k == 0 or speed < 1 - self.margin:
                self.speculating, self.wait = False, self.backoff
                self.last_k = 0
            else:
                self.last_k = k
            return self.last_k
        if k > 0 and speed > 1 + self.margin:  # estimate recovered (e.g. a new prior)
            self.speculating, self.backoff = True, self.min_backoff
            self.last_k = k
            return k
        if self.wait > 0:
            self.wait -= 1
            self.last_k = 0
            return 0
        self.last_k = min(self.probe_k, self.k_max)  # probe: one speculative step refreshes the estimate
        self.wait = self.backoff = min(self.backoff * 2, self.max_backoff)
        return self.last_k

    def calibration(self) -> float:
        """Accepted path length per unit of the drafter's confidence, shrunk towards 1."""
        return (self.tree_hits + self.prior_weight) / (self.tree_expected + self.prior_weight)

    def tree_nodes(self, confidence: list[float]) -> int:
        """The n best nodes (n >= 1) maximising E(n) / (drafting + r(n)), E(n) = 1 + calibration ·
        Σ of the n highest confidences (the module docstring's tree rule)."""
        ranked = sorted(confidence, reverse=True)
        drafting = self.cost.draft_cost * max(self.last_k, 1)  # one drafter pass per depth, already spent
        scale, expected, best = self.calibration(), 1.0, (0.0, 0)
        for n, p in enumerate(ranked, 1):
            expected += scale * p
            best = max(best, (expected / (drafting + self.cost.r(n)), -n))
        n = -best[1]
        self.pending = sum(ranked[:n])
        return n

    def observe(self, step) -> None:
        if self.pending is not None:
            self.tree_hits = self.tree_hits * self.decay + step.accepted
            self.tree_expected = self.tree_expected * self.decay + self.pending
            self.pending = None
        self.observe_counts(step.positions, step.accepted, asked=self.last_k)

    def observe_counts(self, drafted: int, accepted: int, asked: int | None = None) -> None:
        """A verified step: `drafted` positions offered (a tree's depth; its node count is no
        position) of the `asked` requested (default: as many as drafted)."""
        asked = drafted if asked is None else asked
        if asked > 0:
            for counts in (self.asked, self.offered):
                counts[:] = [x * self.decay for x in counts]
            for i in range(min(drafted + 1, asked, self.k_max)):
                self.asked[i] += 1
                self.offered[i] += 1 if i < drafted else 0
        if drafted <= 0:
            return
        reached = min(accepted + 1, drafted)
        for counts in (self.trials, self.hits):
            counts[:] = [x * self.decay for x in counts]
        for i in range(min(reached, self.k_max)):
            self.trials[i] += 1
            self.hits[i] += 1 if i < accepted else 0

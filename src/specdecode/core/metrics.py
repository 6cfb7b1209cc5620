"""Speculation metrics, defined once, as vLLM defines its `spec_decode_*` metrics (vllm/v1/spec_decode/
metrics.py: SpecDecodingStats.observe_draft and SpecDecodingLogging):

- steps: verify forwards (target forwards after the prefill); drafts: the steps that carried at least
  one draft token (vLLM's num_drafts; a step whose drafter offered nothing is a plain step, not a draft).
- drafted / accepted: draft tokens proposed / kept by verification (vLLM's num_draft_tokens /
  num_accepted_tokens; for a token tree: its nodes / the accepted path's length, so α of a tree is
  the share of its nodes that were kept).
- acceptance rate α = accepted / drafted.
- mean acceptance length τ = 1 + accepted / drafts: tokens committed per draft including the
  recovered/bonus token. Tokens per verify forward, 1 + accepted / steps, is lower whenever some
  steps draft nothing (n-gram lookup without a match).
- acceptance by position: accepted_i / drafts, the share of drafts whose position i (1-based; a
  tree's positions are its depths) was accepted (vLLM's per-position acceptance rate); the
  conditional rate accepted_i / reached_i, where reached_i counts drafts whose positions before i
  were all accepted and that reached i, is what adaptive k models.
- target_forwards = decode steps + 1 prefill.
- TTFT: request start to first committed token; mean ITL: mean gap between later tokens.

The formulas below (`acceptance_rate`, `mean_acceptance_length`, `acceptance_by_position`) are the
only ones: Stats, the server's /metrics and /stats, and the monitor all call them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class StepCounts(Protocol):
    """What accounting reads of a step (decoding/step.py's Step): tokens committed, draft tokens (tree
    nodes) offered and accepted, the draft positions (a tree's depth) checked, and its timings."""

    tokens: list[int]
    drafted: int
    accepted: int
    positions: int
    draft_s: float
    verify_s: float
    prefill_s: float


def acceptance_rate(accepted: float, draft_tokens: float) -> float | None:
    """α = accepted / draft tokens (None when nothing was drafted)."""
    return accepted / draft_tokens if draft_tokens else None


def mean_acceptance_length(accepted: float, drafts: float) -> float | None:
    """τ = 1 + accepted / drafts, the bonus token included (None before the first draft)."""
    return 1 + accepted / drafts if drafts else None


def acceptance_by_position(accepted_per_pos: list[float], drafts: float) -> list[float]:
    """accepted_i / drafts for each draft position i."""
    return [a / drafts if drafts else 0.0 for a in accepted_per_pos]


@dataclass
class Stats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    drafts: int = 0
    prefills: int = 0
    new_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    wall_s: float = 0.0
    ttft_s: float = 0.0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)
    reached_by_pos: list[int] = field(default_factory=list)

    def observe(self, drafted: int, accepted: int, committed: int, depth: int | None = None) -> None:
        """One verify forward: `drafted` proposed, `accepted` kept, `committed` tokens emitted.
        depth: for a token tree, its number of draft positions (drafted counts its nodes); the
        by-position counters count positions, so a tree counts once per depth it reached."""
        self.steps += 1
        self.drafts += drafted > 0
        self.drafted += drafted
        self.accepted += accepted
        self.new_tokens += committed
        drafted = drafted if depth is None else depth
        grow = drafted - len(self.drafted_by_pos)
        if grow > 0:
            self.drafted_by_pos += [0] * grow
            self.accepted_by_pos += [0] * grow
            self.reached_by_pos += [0] * grow
        for i in range(drafted):
            self.drafted_by_pos[i] += 1
        for i in range(min(accepted + 1, drafted)):
            self.reached_by_pos[i] += 1
        for i in range(accepted):
            self.accepted_by_pos[i] += 1

    def observe_step(self, step: StepCounts) -> None:
        """What one decode step adds (a decoder Step): the one accounting of a step, used by generate
        and the engine's per-request and per-drafter stats alike, so a tree counts its depth by
        position; its drafting, verification and prefill times too."""
        self.observe(step.drafted, step.accepted, len(step.tokens), step.positions)
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.prefill_s += step.prefill_s

    def merge(self, other: "Stats") -> "Stats":
        out = Stats()
        for name in (
            "drafted",
            "accepted",
            "steps",
            "drafts",
            "prefills",
            "new_tokens",
            "draft_s",
            "verify_s",
            "prefill_s",
            "wall_s",
            "ttft_s",
        ):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        size = max(len(self.drafted_by_pos), len(other.drafted_by_pos))
        pad = lambda xs: xs + [0] * (size - len(xs))  # noqa: E731
        out.drafted_by_pos = [a + b for a, b in zip(pad(self.drafted_by_pos), pad(other.drafted_by_pos))]
        out.accepted_by_pos = [a + b for a, b in zip(pad(self.accepted_by_pos), pad(other.accepted_by_pos))]
        out.reached_by_pos = [a + b for a, b in zip(pad(self.reached_by_pos), pad(other.reached_by_pos))]
        return out

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted) or 0.0

    @property
    def mean_accepted_length(self) -> float:
        """τ (vLLM's mean acceptance length); 1.0 for plain decoding, 0.0 before any step."""
        return mean_acceptance_length(self.accepted, self.drafts) or (1.0 if self.steps else 0.0)

    @property
    def tokens_per_step(self) -> float:
        """Tokens committed per verify forward, counting steps that drafted nothing: 1 + accepted / steps."""
        return 1 + self.accepted / self.steps if self.steps else 0.0

    @property
    def target_forwards(self) -> int:
        return self.steps + self.prefills

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def mean_itl_s(self) -> float:
        """Mean inter-token latency after the first token (per request; averaged when merged)."""
        later = self.new_tokens - self.prefills
        return (self.wall_s - self.ttft_s) / later if later > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return acceptance_by_position(self.accepted_by_pos, self.drafts)

    @property
    def conditional_acceptance(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted_by_pos, self.reached_by_pos)]

    def to_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_by_position": [round(x, 4) for x in self.acceptance_by_position],
            "target_forwards": self.target_forwards,
            "new_tokens": self.new_tokens,
            "wall_s": round(self.wall_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "ttft_s": round(self.ttft_s, 4),
            "mean_itl_s": round(self.mean_itl_s, 5),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "prefill_s": round(self.prefill_s, 4),
            "other_s": round(max(0.0, self.wall_s - self.draft_s - self.verify_s - self.prefill_s), 4),
        }

    def summary(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.wall_s:.2f}s ({self.tokens_per_s:.1f} tok/s) | "
            f"α {self.acceptance_rate:.2f} ({self.accepted}/{self.drafted}) | "
            f"τ {self.mean_accepted_length:.2f} | "
            f"{self.target_forwards} target forwards | TTFT {self.ttft_s * 1000:.0f} ms"
        )

"""Speculation metrics, defined once.

- drafted / accepted: draft tokens proposed / kept by verification (for a token tree: its nodes /
  the accepted path's length, so α of a tree is the share of its nodes that were kept).
- acceptance rate α = accepted / drafted.
- mean accepted length τ = tokens committed per verify forward including the recovered/bonus
  token = 1 + accepted / steps (vLLM's "mean acceptance length").
- acceptance by position: for draft position i (1-based), accepted_i / drafted_i (vLLM's
  per-position rate; a tree's positions are its depths); the conditional rate accepted_i / reached_i,
  where reached_i counts steps whose drafts before i were all accepted, is what adaptive k models.
- target_forwards = decode steps + 1 prefill.
- TTFT: request start to first committed token; mean ITL: mean gap between later tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
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

    def merge(self, other: "Stats") -> "Stats":
        out = Stats()
        for name in ("drafted", "accepted", "steps", "prefills", "new_tokens", "draft_s", "verify_s",
                     "prefill_s", "wall_s", "ttft_s"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        size = max(len(self.drafted_by_pos), len(other.drafted_by_pos))
        pad = lambda xs: xs + [0] * (size - len(xs))  # noqa: E731
        out.drafted_by_pos = [a + b for a, b in zip(pad(self.drafted_by_pos), pad(other.drafted_by_pos))]
        out.accepted_by_pos = [a + b for a, b in zip(pad(self.accepted_by_pos), pad(other.accepted_by_pos))]
        out.reached_by_pos = [a + b for a, b in zip(pad(self.reached_by_pos), pad(other.reached_by_pos))]
        return out

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
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
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_pos, self.drafted_by_pos)]

    @property
    def conditional_acceptance(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted_by_pos, self.reached_by_pos)]

    def to_dict(self) -> dict:
        return {
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
            f"α {self.acceptance_rate:.2f} ({self.accepted}/{self.drafted}) | τ {self.mean_accepted_length:.2f} | "
            f"{self.target_forwards} target forwards | TTFT {self.ttft_s * 1000:.0f} ms"
        )

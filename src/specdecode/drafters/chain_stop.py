"""`stop=P|auto` for chains: how long a chain of drafted tokens pays for itself.

A chain's i-th token (from 1) survives verification with odds s_i: the product of the draft's
probabilities of the tokens up to it (a model or a head), or this request's record (n-gram lookup).
It saves one target step when it survives and costs its verification row, the target's r(i) - r(i-1)
of a step, where r(n) = T(n + 1) / T(1). So a chain keeps token i while s_i >= r(i) - r(i-1), and
drafts token i + 1 (a draft step, c of a target step, and its row) only while s_i >= c + r(i + 1) - r(i).

With sampling, a token is judged before it is drawn, on its expected probability (the sum of q
squared), and only the bar for the next token looks at the drawn ones: a stopping rule, so rejection
sampling stays exact (a drawn token judged on its own q skews the output; test_decoder checks it).

`stop=P` fixes both bars at P (a fraction). `stop=auto` prices the rows with the engine's own
measured r(n) at each step (engine/load.py: measured at start-up, refreshed by every forward), so the
bars follow the machine's present phase: on an AVX2 Zen 5 the 1.5B's T(1) moved between 18 and 25 ms
while T(5) stayed ~36 ms, and a row cost 0.18 of a step in one phase and 0.45 in the other. Without an
engine's costs (the single-sequence loop) it prices every row at v, measured once when the drafter is
built (draft_model.chain_costs), as it prices c, the drafter's step.

A head's probabilities are its training data's: on prompts unlike that data they promise more than
verification keeps (the 1.5B's EAGLE head on held-out writing: first tokens kept 0.29 of the time).
`Calibration` scales them by this request's record, the tokens kept over the probabilities stated
for the tokens that were tried, so a request whose drafts keep failing drafts shorter chains. The
record holds only finished steps: a stopping rule still, exact under sampling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Rows = Callable[[], list[float]]  # -> [r(0) = 1, r(1), ..., r(K)], the target's live costs


@dataclass
class ChainStop:
    fixed: float = 0.0  # stop=P: both bars at P (0, and no costs: never stop)
    cost: float = 0.0  # stop=auto: c, the drafter's step over a target step (0: lookup, free)
    row: float = 0.0  # stop=auto: v, one verification row over a target step, measured at build
    rows: Rows | None = None  # stop=auto: the engine's live costs, when it has them

    @classmethod
    def of(cls, stop: "float | ChainStop") -> "ChainStop":
        """A drafter's stop argument: P as a fraction (0: never stop), or a ChainStop as it is."""
        return stop if isinstance(stop, ChainStop) else cls(fixed=stop)

    @property
    def active(self) -> bool:
        return bool(self.fixed or self.cost or self.row or self.rows)

    def bars(self, k: int) -> tuple[list[float], list[float]]:
        """-> (keep, go_on), k each: token i (from 0) is kept while the chain's odds s_i >= keep[i],
        and token i + 1 drafted while s_i >= go_on[i]."""
        if self.fixed or not self.active:
            return [self.fixed] * k, [self.fixed] * k
        ratio = list(self.rows()) if self.rows is not None else [1.0, 1.0 + self.row]
        slope = ratio[-1] - ratio[-2] if len(ratio) > 1 else self.row
        while len(ratio) < k + 2:  # past the measured rows: the last row's price
            ratio.append(ratio[-1] + slope)
        row = [max(0.0, ratio[i + 1] - ratio[i]) for i in range(k + 1)]  # the (i+1)-th row's price
        return row[:k], [self.cost + row[i + 1] for i in range(k)]

    def describe(self) -> str:
        if self.fixed:
            return f"a chain keeps tokens while its odds are >= {100 * self.fixed:g}%"
        keep, _ = self.bars(4)
        source = "the engine's live costs" if self.rows is not None else "measured at start"
        return (
            f"a chain keeps token i while its odds pay its row ({', '.join(f'{100 * x:.0f}%' for x in keep)} "
            f"for i = 1..4 now, {source}) and drafts on while they pay a step ({100 * self.cost:.1f}%) "
            "and the next row"
        )


class Calibration:
    """A request's record of a drafter's stated odds: scale(p) = p times the tokens verification kept
    over the sum of the probabilities stated for the tokens it tried (up to the first rejection), with
    PRIOR tried tokens kept as stated; capped at 1."""

    PRIOR = 2.0

    def __init__(self):
        self.stated = self.kept = self.PRIOR
        self.last: list[float] = []  # the last chain's per-token probabilities, as drafted

    def chain(self) -> list[float]:
        """A new chain's record of stated probabilities, to append each drafted token's to."""
        self.last = []
        return self.last

    def scale(self, p: float) -> float:
        return min(1.0, p * self.kept / self.stated)

    def observe(self, drafted: int, accepted: int) -> None:
        tried = min(drafted, accepted + 1, len(self.last))
        self.stated += sum(self.last[:tried])
        self.kept += min(accepted, tried)
        self.last = []

"""How much prompt a step may prefill beside the others' decoding (chunked prefill): the one place
that decides a prefill chunk's size.

Work is counted in rows of matmuls (chunk_cost): a token at a deep context costs more than one at
the start, since it also attends to everything before it. A step's forward time is modelled as a
line in its work W (decode rows and prompt rows alike),

    t(W) = fixed + per_unit * W,

drawn live through two points: the median (W, t) of the recent steps that only decoded and that of
the recent steps that also prefilled. A step beside decoding
rows of work D may add prompt work P while it costs at most RATIO times the plain decode step:

    t(D + P) <= RATIO * t(D)   <=>   P <= (RATIO - 1) * t(D) / per_unit,

at most `chunk` (serve --prefill-chunk) and at least MIN_PREFILL, so a long prompt advances every
step. Until both points are known the line goes through the origin (t proportional to W), which
allows P = (RATIO - 1) * D. A step in which nothing decodes keeps nobody waiting: its prompts get
`chunk` * IDLE_PREFILL.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

PREFILL_BUDGET = 128  # the most prompt work (chunk_cost) a step beside decoding rows carries: the default
IDLE_PREFILL = 8  # a step in which nothing decodes prefills IDLE_PREFILL times as much
RATIO = 2.0  # a step that prefills beside decoding rows costs at most this many plain decode steps
MIN_PREFILL = 16  # ... but carries at least this much prompt work: a long prompt is never starved


def chunk_cost(n: int, start: int, span: float | None) -> float:
    """What n tokens after `start` cached ones cost, in rows of matmuls: each token also attends to
    the context before it, `span` tokens of which cost as much as its matmuls (the model's
    attention_span; None: tokens only)."""
    return float(n) if span is None else n * (1 + (start + (n + 1) / 2) / span)


def chunk_size(budget: float, start: int, remaining: int, span: float | None) -> int:
    """The most prompt tokens (at least 1, at most `remaining`) whose chunk_cost fits `budget`."""
    if span is None:
        n = int(budget)
    else:  # n (1 + (start + 1/2) / span) + n^2 / (2 span) = budget, for n
        b = 1 + (start + 0.5) / span
        n = int(span * (math.sqrt(b * b + 2 * budget / span) - b))
        while n > 1 and chunk_cost(n, start, span) > budget:  # float rounding
            n -= 1
    return max(1, min(n, remaining))


class _Recent:
    """The median point (work, seconds) of the last `size` steps of one kind: a slow step (the cache
    growing, a busy neighbour on a shared machine) moves it little."""

    def __init__(self, size: int):
        self.steps: deque[tuple[float, float]] = deque(maxlen=size)

    def add(self, work: float, seconds: float) -> None:
        self.steps.append((work, seconds))

    def point(self) -> tuple[float, float] | None:
        if not self.steps:
            return None
        return statistics.median(w for w, _ in self.steps), statistics.median(t for _, t in self.steps)


class PrefillBudget:
    def __init__(self, chunk: int = PREFILL_BUDGET, ratio: float = RATIO, window: int = 32):
        self.chunk, self.ratio = chunk, ratio
        self.decoding = _Recent(window)  # steps with decode rows only
        self.prefilling = _Recent(window)  # steps with prompt rows (beside decode rows or not)

    def work(self, decode_work: float) -> float:
        """The prompt work (chunk_cost) a step may carry beside decode rows of `decode_work`."""
        if decode_work <= 0:
            return float(self.chunk * IDLE_PREFILL)
        fixed, per_unit = self.line()
        allowed = (self.ratio - 1) * (fixed / per_unit + decode_work)
        return max(float(min(MIN_PREFILL, self.chunk)), min(float(self.chunk), allowed))

    def line(self) -> tuple[float, float]:
        """(fixed seconds, seconds per unit of work) of a step, from the two mean points; through the
        origin while they are unknown, too close to tell apart, or say a step gets cheaper with work."""
        d, p = self.decoding.point(), self.prefilling.point()
        if d is not None and p is not None and p[0] - d[0] >= 1:
            per_unit = (p[1] - d[1]) / (p[0] - d[0])
            fixed = d[1] - per_unit * d[0]
            if per_unit > 0 and d[1] > 0:
                return fixed, per_unit
        return 0.0, 1.0

    def observe(self, decode_work: float, prompt_work: float, seconds: float) -> None:
        """One step's forward: its decode rows' and prompt rows' work and its time."""
        (self.prefilling if prompt_work else self.decoding).add(decode_work + prompt_work, seconds)

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
step. The span (cached tokens whose attention costs a row its matmuls) starts from the model's FLOP
count (batch_model.attention_span) and is then measured: a plane t = c + a * rows + b * keys through
the recent steps' forwards (keys: the cached positions their rows attend to) gives span = a / b. On
the int8 kernels the matmuls run much faster per multiply-add than attention's float32 ones (and deep
keys stream from memory), so the FLOP span priced a deep chunk far below its cost (docs/server.md, from
the server's step trace). Until both points are known the line goes through the origin (t proportional
to W), which allows P = (RATIO - 1) * D. A step in which nothing decodes keeps nobody waiting: its
prompts get `chunk` * IDLE_PREFILL.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

PREFILL_BUDGET = 128  # the most prompt work (chunk_cost) a step beside decoding rows carries: the default
IDLE_PREFILL = 8  # a step in which nothing decodes prefills IDLE_PREFILL times as much
RATIO = 1.75  # a step that prefills beside decoding rows costs at most this many plain decode steps
MIN_PREFILL = 16  # ... but carries at least this much prompt work: a long prompt is never starved
MIN_SPAN = 16.0  # a measured span below this is not believed (noise on a shared machine)
SPAN_STEPS = 8  # the span is measured once this many recent steps carried prompt rows


def keys(n: int, start: int) -> int:
    """Cached positions n rows after `start` cached ones attend to (each row also to itself)."""
    return n * start + n * (n + 1) // 2


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
        self.shapes: deque[tuple[int, int, float, bool]] = deque(maxlen=2 * window)  # rows, keys, s, prompt?

    def span(self, flops: float | None) -> float | None:
        """The measured span (see the module's docstring), or `flops` (the model's FLOP-count span;
        None: rows only) until SPAN_STEPS recent steps carried prompt rows or when the plane says a
        row or a key is free; never above `flops` (attention is not cheaper than its FLOPs say)."""
        if flops is None or sum(p for *_, p in self.shapes) < SPAN_STEPS:
            return flops
        a = np.array([(1.0, r, k) for r, k, _, _ in self.shapes])
        t = np.array([s for _, _, s, _ in self.shapes])
        (_, per_row, per_key), *_ = np.linalg.lstsq(a, t, rcond=None)
        if per_row <= 0 or per_key <= 0:
            return flops
        return float(min(flops, max(MIN_SPAN, per_row / per_key)))

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

    def observe(
        self, decode_work: float, prompt_work: float, seconds: float, rows: int = 0, attended: int = 0
    ) -> None:
        """One step's forward: its decode rows' and prompt rows' work, its time, and its rows and the
        cached positions they attend to (keys(); 0, 0: not known, the span stays the model's)."""
        (self.prefilling if prompt_work else self.decoding).add(decode_work + prompt_work, seconds)
        if rows:
            self.shapes.append((rows, attended, seconds, bool(prompt_work)))

"""Two samples of completions, one without speculation and one with: does speculation change the
output distribution? Pure functions of the samples and an explicit random generator.

The distribution over the first m tokens jointly has |V|^m outcomes; with a few hundred samples
nearly every joint outcome is seen once, and the empirical TV of two samples from the SAME
distribution is close to 1. The deviation of an empirical distribution grows with its support
(Weissman et al. 2003: P(TV(p̂_n, p) >= t) <= 2^support exp(-2 n t²); tests/helpers.py, tv_bound),
so we compare views with small supports, each a function of the completion and therefore equal
in distribution when speculation is lossless:

  - the marginal of token i, for each position i = 1..m (a bias at any position shows in its own);
  - the joint of the first two tokens (a bias in how a second draft depends on the first).

The statistic is, summed over prompts, the largest TV among these views for that prompt; its null
distribution comes from a permutation test within each prompt (labels "plain"/"speculative"
reshuffled over the prompt's pooled samples: exchangeable when the two distributions are equal),
so the p-value is exact up to Monte Carlo error whatever the supports, and taking the largest view
needs no multiple-comparison correction inside one drafter and temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

END = -1  # the completion ended (EOS) before this position


@dataclass
class Comparison:
    tv: float  # observed statistic: mean over prompts of the largest view TV
    views: dict[str, float]  # per view, mean over prompts of its TV ("token 1", ..., "tokens 1-2")
    p_value: float  # permutation p-value of `tv`
    permutations: int


def token_views(m: int) -> Callable[[list], dict[str, np.ndarray]]:
    """Completions as token ids (at most m each) -> per view an integer code per completion [n]."""

    def view(samples: list[list[int]]) -> dict[str, np.ndarray]:
        padded = np.array([list(s[:m]) + [END] * (m - len(s[:m])) for s in samples], dtype=np.int64)  # [n, m]
        out = {f"token {i + 1}": padded[:, i] for i in range(m)}
        if m >= 2:
            out["tokens 1-2"] = (padded[:, 0] + 1) * (1 << 32) + padded[:, 1] + 1
        return out

    return view


def text_view(texts: list[str]) -> dict[str, np.ndarray]:
    """Completions known only as text (a server's answers) -> one view: the text itself."""
    index: dict[str, int] = {}
    return {"text": np.array([index.setdefault(t, len(index)) for t in texts], dtype=np.int64)}


def dense(codes: np.ndarray) -> np.ndarray:
    """Codes -> 0..distinct-1 (bincount's input)."""
    return np.unique(codes, return_inverse=True)[1].reshape(-1)


def tv_split(codes: np.ndarray, first: np.ndarray) -> float:
    """TV between the empirical distributions of codes[first] and codes[~first]; codes: dense [n],
    first: boolean mask [n]."""
    size = int(codes.max()) + 1
    a = np.bincount(codes[first], minlength=size) / first.sum()
    b = np.bincount(codes[~first], minlength=size) / (~first).sum()
    return 0.5 * float(np.abs(a - b).sum())


def compare(
    plain: list[list],
    spec: list[list],
    view: Callable[[list], dict[str, np.ndarray]],
    permutations: int,
    rng: np.random.Generator,
) -> Comparison:
    """plain[j], spec[j]: prompt j's completions without and with speculation; view: completions ->
    their views (token_views, text_view) -> the statistic and its permutation p-value."""
    pooled = [{name: dense(c) for name, c in view(list(a) + list(b)).items()} for a, b in zip(plain, spec)]
    labels = [np.arange(len(a) + len(b)) < len(a) for a, b in zip(plain, spec)]

    def statistic(masks) -> tuple[float, dict[str, float]]:
        per_view: dict[str, float] = {}
        total = 0.0
        for prompt, mask in zip(pooled, masks):
            tvs = {name: tv_split(codes, mask) for name, codes in prompt.items()}
            total += max(tvs.values())
            for name, value in tvs.items():
                per_view[name] = per_view.get(name, 0.0) + value / len(pooled)
        return total / len(pooled), per_view

    observed, per_view = statistic(labels)
    exceed = 0
    for _ in range(permutations):
        exceed += statistic([rng.permutation(mask) for mask in labels])[0] >= observed - 1e-12
    return Comparison(observed, per_view, (1 + exceed) / (1 + permutations), permutations)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error control over several drafters and temperatures."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted

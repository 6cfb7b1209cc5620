"""Total-variation bound for comparing an empirical distribution with the exact one.

Weissman et al. 2003 ("Inequalities for the L1 deviation of the empirical distribution"):
P(||p̂ - p||₁ >= ε) <= (2^m - 2) exp(-n ε² / 2) for m outcomes and n samples. With TV = L1 / 2,
P(TV >= t) <= 2^m exp(-2 n t²), so t = sqrt((m ln 2 + ln(1/δ)) / (2n)) is exceeded by a correct
sampler with probability below δ. We use δ = 1e-6: a failure is a bug, not bad luck; and the
negative controls show that real bugs exceed it by a wide margin.
"""

import math

import torch

DELTA = 1e-6


def tv_bound(outcomes: int, samples: int, delta: float = DELTA) -> float:
    return math.sqrt((outcomes * math.log(2) + math.log(1 / delta)) / (2 * samples))


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    empirical = counts.double() / counts.sum()
    return 0.5 * float((empirical - probs.double()).abs().sum())

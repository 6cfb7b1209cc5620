"""Sampling as pure functions of logits, parameters and an explicit generator.

The same `warp` is applied to the target's logits (p) and the drafter's logits (q), so that
rejection sampling compares the two distributions the user actually asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.errors import UserError


@dataclass(frozen=True)
class Warp:
    """What `warp` applies to the target's and the drafter's logits alike; the default is greedy. A
    request's parameters (api/params.py: SamplingParams, vLLM's names and defaults) hand theirs over
    with `distribution()`."""

    temperature: float = 0.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 means no top-k filter
    top_p: float = 1.0  # 1 means no nucleus filter

    def __post_init__(self):
        if not self.temperature >= 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UserError(f"top-k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, params: Warp) -> torch.Tensor:
    """logits: [..., V] -> probabilities [..., V] (float32) after temperature, top-k and top-p.

    Greedy parameters give the one-hot distribution of the argmax. Safe for any valid parameters:
    a temperature so small that logits / T overflows behaves as greedy (the limit of T -> 0), and
    top-p always keeps the most likely token, however small p is (1e-46 underflows to 0 in float32).
    """
    logits = logits.float()
    if params.greedy:
        return _one_hot_argmax(logits)
    scaled = logits / params.temperature
    overflow = (scaled.isnan() | (scaled == float("inf"))).any(-1, keepdim=True)  # [..., 1]
    logits = torch.where(overflow, logits, scaled)
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already cover top_p; the top one always stays.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(-1)
    return torch.where(overflow | probs.isnan().any(-1, keepdim=True), _one_hot_argmax(logits), probs)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> each row's index of its largest value (the first of equal ones), long [...].
    On the CPU through numpy: torch's CPU argmax goes one element at a time (several times numpy's
    cost over a vocabulary's logits), paid on every greedy step and verification."""
    picked = _numpy_argmax(logits)
    return logits.argmax(-1) if picked is None else torch.as_tensor(picked)


def argmax_ids(logits: torch.Tensor) -> list[int] | int:
    """As argmax, as Python ints (a list for [n, V], an int for [V]) without a tensor in between: each
    torch call after a forward starts cold (docs/native_forward.md), and verification asks every step."""
    picked = _numpy_argmax(logits)
    return (logits.argmax(-1) if picked is None else picked).tolist()


def _numpy_argmax(logits: torch.Tensor):
    """numpy's argmax over the last axis of CPU float logits (argmax says why), else None."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(-1)
    return None


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(argmax(logits), logits.shape[-1]).float()


BLOCK = 1024  # entries a block of the two-level inverse CDF (sample)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """probs: [V] non-negative weights (any positive total) -> one token id drawn with `generator`, by
    inverse CDF from one float64 uniform: the block holding it by the cumulative block sums, then the
    token by the cumulative sums inside that block, both in float64. A token of weight 0 is never drawn.
    torch.multinomial took ~3.4 ms for one draw over Qwen2.5's 151,936 tokens on a Zen 5 core, this
    ~0.13 ms: it was a quarter of `train data`'s sampled passes (16 sequences a step)."""
    n = probs.shape[0]
    full = n // BLOCK * BLOCK
    sums = probs[:full].view(-1, BLOCK).sum(1, dtype=torch.float64)  # [n / BLOCK]
    if full < n:
        sums = torch.cat([sums, probs[full:].sum(0, dtype=torch.float64).reshape(1)])
    ends = sums.cumsum(0)
    u = torch.rand(1, generator=generator, dtype=torch.float64, device=probs.device) * ends[-1]
    b = min(int(torch.searchsorted(ends, u, right=True)), len(ends) - 1)
    if b:
        u = u - ends[b - 1]
    block = probs[b * BLOCK : (b + 1) * BLOCK]
    i = min(int(torch.searchsorted(block.double().cumsum(0), u, right=True)), len(block) - 1)
    if not block[i] > 0:  # u at the block's end by rounding: its last token of positive weight
        i = int(block[: i + 1].nonzero()[-1])
    return b * BLOCK + i


def next_token(logits: torch.Tensor, params: Warp, generator: torch.Generator | None) -> int:
    """logits: [V] -> the next token: argmax when greedy, else a draw from warp(logits)."""
    if params.greedy:
        return int(argmax(logits))
    return sample(warp(logits, params), generator)

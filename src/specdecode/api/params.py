"""SamplingParams: what one request asks for, named as vLLM names it (vllm.SamplingParams) where the
meaning is the same: temperature, top_p, top_k, max_tokens, stop, seed, ignore_eos, structured_outputs.

The decoder sees only the distribution part (core.sampling.Warp: the same warp is applied to p
and q); the rest bounds and cuts the completion.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.api.structured import StructuredOutputs, check_ignore_eos
from specdecode.core import sampling
from specdecode.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy (argmax)
    top_p: float = 1.0  # 1: no nucleus filter
    top_k: int = 0  # 0: no top-k filter (vLLM also takes -1 for "off")
    max_tokens: int = 16  # new tokens at most
    stop: tuple[str, ...] = ()  # the completion ends before the first of these strings
    seed: int | None = None  # None: a fresh random seed per request
    ignore_eos: bool = False  # keep going past the end-of-sequence token
    structured_outputs: StructuredOutputs | None = None  # a grammar the output follows (structured.py)

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise UserError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise UserError(f"seed must be an integer or None, got {self.seed!r}")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputs):
                raise UserError(
                    f"structured_outputs must be a StructuredOutputs, got {self.structured_outputs!r:.60}"
                )
            check_ignore_eos(self.ignore_eos, "structured_outputs")
        self.distribution()  # temperature, top_p, top_k checked once, by the core's own rules

    def distribution(self) -> sampling.Warp:
        """The part the decoder uses: temperature, top-k and top-p."""
        return sampling.Warp(self.temperature, self.top_k, self.top_p)

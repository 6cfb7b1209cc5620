"""What goes into the engine (Request) and what comes out of it: events per request (Delta, Done,
Failed) through the request's sink, and its Usage in OpenAI's shape with vLLM's speculative counters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdecode.core.metrics import Stats, acceptance_rate, mean_acceptance_length
from specdecode.core.sampling import Warp
from specdecode.decoding import batch_decoder
from specdecode.decoding.logprobs import TokenLogprob
from specdecode.decoding.penalties import Penalties
from specdecode.decoding.text import TextStream
from specdecode.drafters.spec import Spec, parse
from specdecode.engine.capture import Capture
from specdecode.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass
class Request:
    prompt: list[int]
    params: Warp
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None
    drafter: Spec = field(default_factory=lambda: parse("ngram"))  # parsed once, where the request came in
    k: int = 4  # fixed k, or the largest k adaptive control may choose
    adaptive: bool = False
    task: str = "creative"
    ignore_eos: bool = False
    timeout_s: float | None = None
    scope: str = ""  # whose suffix cache the request reads and feeds (suffix_cache.py)
    penalties: Penalties | None = None
    grammar: str | None = None  # a compiled grammar (decoding/grammar.py: Grammars) the output must follow
    logprobs: int | None = None  # report the target's logprobs with this many top ones per token
    after: RequestState | None = None  # n > 1: a sibling whose prompt KV this one waits for (prefix cache)
    request_id: str = ""  # X-Request-Id: names the request in the log
    capture: tuple[int, ...] = ()  # target layers whose rows Done.features returns (engine/capture.py)


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    drafter: str
    task: str
    k: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    steps: int = 0  # verify forwards
    accepted_by_position: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "speculative": {
                "drafter": self.drafter,
                "task": self.task,
                "k": self.k,
                "num_drafts": self.num_drafts,
                "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_verify_forwards": self.steps,
                "acceptance_rate": acceptance_rate(self.num_accepted_tokens, self.num_draft_tokens),
                "mean_acceptance_length": mean_acceptance_length(self.num_accepted_tokens, self.num_drafts),
                "num_accepted_tokens_per_pos": list(self.accepted_by_position),
            },
        }


@dataclass
class Delta:
    """Text newly safe to show, with what was committed since the last Delta."""

    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens committed since the last
    tokens: list[int] = field(default_factory=list)  # the tokens committed since the last Delta
    from_draft: list[bool] = field(default_factory=list)  # [len(tokens)] accepted drafts (else the target's)


@dataclass
class Done:
    finish_reason: str  # "stop", "length" (OpenAI) or "abort" (cancelled)
    usage: Usage
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of tokens not delivered with a Delta
    tokens: list[int] = field(default_factory=list)  # the whole completion
    from_draft: list[bool] = field(default_factory=list)  # [len(tokens)]
    stats: Stats = field(default_factory=Stats)  # the request's speculation and timings
    route: dict = field(default_factory=dict)  # task, drafter, k, adaptive, realised_speedup
    # Request.capture's rows at every position of prompt and completion but the last:
    # [len(prompt) + len(tokens) - 1, len(capture) * H] float32 (None without capture, or aborted)
    features: torch.Tensor | None = None


@dataclass
class Failed:
    status: int
    type: str
    message: str
    error: BaseException | None = None  # what raised, for a client in the same process to re-raise


Event = Delta | Done | Failed


@dataclass(eq=False)
class Collected:
    """A request's events as a client in the same process keeps them (`add` is the request's sink)."""

    deltas: list[Delta] = field(default_factory=list)
    done: Done | None = None
    failed: Failed | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, Delta):
            self.deltas.append(event)
        elif isinstance(event, Done):
            self.done = event
        else:
            self.failed = event

    @property
    def finished(self) -> bool:
        return self.done is not None or self.failed is not None

    @property
    def text(self) -> str:
        """The text delivered so far (the completion's, once finished)."""
        return "".join(d.text for d in self.deltas)

    def check(self) -> None:
        """Raise what made the request fail: the engine's error itself, else its message."""
        if self.failed is not None:
            raise self.failed.error or RuntimeError(self.failed.message)


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


class TooLarge(UserError):
    """A request whose prompt and output the KV cache memory could never hold."""


@dataclass(eq=False)
class RequestState:
    """One request inside the engine (engine-thread state, except the `cancelled` flag)."""

    id: int
    request: Request
    sink: Callable[[Event], None]
    dec: batch_decoder.Sequence  # its decoding state in the core
    arrival: float
    text: TextStream
    stats: Stats = field(default_factory=lambda: Stats(prefills=1))
    num_drafts: int = 0
    last_delivery: float | None = None
    cancelled: bool = False
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet delivered
    from_draft: list[bool] = field(default_factory=list)  # per committed token: an accepted draft
    delivered: int = 0  # tokens handed out with a Delta
    capture: Capture | None = None  # its drafter, where the request captures features (Request.capture)

    @property
    def out(self) -> list[int]:
        """The completion's tokens."""
        return self.text.tokens

    @property
    def deadline(self) -> float | None:
        t = self.request.timeout_s
        return None if t is None else self.arrival + t

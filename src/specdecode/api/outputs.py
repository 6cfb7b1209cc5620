"""What a request returns, in vLLM's shape (RequestOutput with a list of CompletionOutput), plus
what speculation did for it: `metrics`, the core's Stats (α, τ, acceptance by position, target
forwards, timings; metrics.py defines each once), and, per token, whether it was an accepted draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdecode.core.metrics import Stats


@dataclass
class CompletionOutput:
    index: int  # which completion of the request (always 0: one completion per request)
    text: str  # the completion, cut before a stop string
    token_ids: list[int]  # its tokens
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens)
    from_draft: list[bool]  # [len(token_ids)] True: an accepted draft token; False: the target's own


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: Stats  # this request's speculation: acceptance_rate (α), mean_accepted_length (τ), ...
    finished: bool = True
    route: dict = field(default_factory=dict)  # routed requests: task, drafter, k, adaptive, speedup

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason

    def to_json(self) -> dict:
        return {
            "id": self.request_id,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "prompt_tokens": len(self.prompt_token_ids),
            "stats": self.metrics.to_dict(),
        }


@dataclass
class StreamDelta:
    """One step's increment of a streamed request (LLM.stream)."""

    text: str  # text newly safe to show (no half of a stop string, no broken character)
    token_ids: list[int]  # tokens this step committed
    from_draft: list[bool]  # [len(token_ids)] which of them were accepted drafts
    output: RequestOutput | None = None  # set on the last delta only: the finished request

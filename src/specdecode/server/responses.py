"""Response bodies of the OpenAI-compatible API: completions and chat, whole or as stream chunks, one
choice per sample (n), with the target's log-probabilities in each endpoint's OpenAI shape:
- /v1/completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
- /v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from specdecode.decoding.logprobs import TokenLogprob


def merge_usage(usages: list[dict]) -> dict:
    """The usage of n samples of one prompt: the prompt counted once, completions and speculation summed
    (per-position acceptance summed position by position; rates recomputed from the sums)."""
    if len(usages) == 1:
        return usages[0]
    out = {"prompt_tokens": usages[0]["prompt_tokens"]}
    out["completion_tokens"] = sum(u["completion_tokens"] for u in usages)
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    spec = dict(usages[0]["speculative"])
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_verify_forwards"):
        spec[key] = sum(u["speculative"][key] for u in usages)
    per_pos = [u["speculative"]["num_accepted_tokens_per_pos"] for u in usages]
    spec["num_accepted_tokens_per_pos"] = [
        sum(p[i] for p in per_pos if i < len(p)) for i in range(max(map(len, per_pos)))
    ]
    spec["acceptance_rate"] = (
        spec["num_accepted_tokens"] / spec["num_draft_tokens"] if spec["num_draft_tokens"] else None
    )
    spec["mean_acceptance_length"] = (
        1 + spec["num_accepted_tokens"] / spec["num_drafts"] if spec["num_drafts"] else None
    )
    out["speculative"] = spec
    return out


class CompletionFormat:
    object, chunk_object, prefix = "text_completion", "text_completion", "cmpl"

    def __init__(self, model: str, token_text: Callable[[int], str], n: int = 1):
        """token_text: a token id's text (for logprobs)."""
        self.id, self.model, self.created = f"{self.prefix}-{uuid.uuid4().hex}", model, int(time.time())
        self.token_text = token_text
        self.offsets = [0] * n  # text_offset of the next token, per choice

    def _wrap(self, obj: str, choices: list, usage: dict | None = None) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    def logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        if entries is None:
            return None
        tokens = [self.token_text(e.token) for e in entries]
        offsets = []
        for text in tokens:
            offsets.append(self.offsets[index])
            self.offsets[index] += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{self.token_text(t): lp for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }

    def opening(self) -> list[dict]:
        return []

    def chunk(self, index: int, text: str, logprobs: dict | None, finish_reason: str | None = None) -> dict:
        return self._wrap(
            self.chunk_object,
            [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        )

    def usage_chunk(self, usage: dict) -> dict:
        return self._wrap(self.chunk_object, [], usage)

    def full(self, choices: list[tuple[str, str, dict | None]], usage: dict) -> dict:
        """choices: (text, finish_reason, logprobs) per sample."""
        return self._wrap(
            self.object,
            [
                {"index": i, "text": text, "logprobs": lp, "finish_reason": reason}
                for i, (text, reason, lp) in enumerate(choices)
            ],
            usage,
        )


class ChatFormat(CompletionFormat):
    object, chunk_object, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        if entries is None:
            return None

        def one(token: int, logprob: float) -> dict:
            text = self.token_text(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {
            "content": [
                {**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries
            ],
            "refusal": None,
        }

    def opening(self) -> list[dict]:
        return [
            self._wrap(
                self.chunk_object,
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            )
            for i in range(len(self.offsets))
        ]

    def chunk(self, index: int, text: str, logprobs: dict | None, finish_reason: str | None = None) -> dict:
        delta = {"content": text} if text else {}
        return self._wrap(
            self.chunk_object,
            [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
        )

    def full(self, choices: list[tuple[str, str, dict | None]], usage: dict) -> dict:
        return self._wrap(
            self.object,
            [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": lp,
                    "finish_reason": reason,
                }
                for i, (text, reason, lp) in enumerate(choices)
            ],
            usage,
        )

"""Text in, text out: prompt encoding (chat template), stop strings and streaming (text.py), stats.

The decoder works on token ids only; this layer owns the tokenizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specdecode.backends.models import LoadedModel
from specdecode.core.drafter import Drafter
from specdecode.core.metrics import Stats
from specdecode.core.sampling import Warp
from specdecode.decoding.control import KPolicy
from specdecode.decoding.decoder import decode
from specdecode.decoding.text import TextStream
from specdecode.errors import UserError

MAX_K = 64


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: Stats
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    prompt_tokens: int = 0
    from_draft: list[bool] = field(default_factory=list)  # per token: an accepted draft (else the target's)
    id: str | None = None
    category: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "category": self.category,
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "stats": self.stats.to_dict(),
        }


def encode_prompt(tokenizer, prompt: str, chat: bool | None) -> list[int]:
    """Prompt text -> token ids; chat=None applies the chat template when the tokenizer has one."""
    if not prompt or not prompt.strip():
        raise UserError("empty prompt")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat and not has_template:
        raise UserError("--chat requested but the model's tokenizer has no chat template")
    if chat or (chat is None and has_template):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def check_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise UserError(f"k must be between 1 and {MAX_K}, got {k}")
    return k


def generate(
    target: LoadedModel,
    drafter: Drafter,
    prompt: str | list[int],
    *,
    k: int | KPolicy = 4,
    params: Warp = Warp(),
    max_new_tokens: int = 128,
    chat: bool | None = None,
    stop: Sequence[str] = (),
    seed: int = 0,
    on_text: Callable[[str], None] | None = None,
    ignore_eos: bool = False,
) -> Result:
    """Generate a completion of `prompt` (text, or token ids used as they are).
    k: drafts per step, or a policy choosing k before every step (control.AdaptiveK)."""
    if isinstance(k, int):
        check_k(k)
    if max_new_tokens <= 0:
        raise UserError(f"max_new_tokens must be positive, got {max_new_tokens}")
    tok = target.tokenizer
    ids = list(prompt) if isinstance(prompt, list) else encode_prompt(tok, prompt, chat)
    if not ids:
        raise UserError("empty prompt")
    limit = target.model.max_length
    if len(ids) + max_new_tokens > limit:
        raise UserError(
            f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {limit} tokens"
        )
    generator = torch.Generator(device=target.model.device).manual_seed(seed)
    eos_ids = frozenset() if ignore_eos else frozenset(target.eos_ids)
    stream = TextStream(tok, stop, eos_ids)
    from_draft: list[bool] = []
    stats = Stats(prefills=1)
    start = time.perf_counter()
    for step in decode(
        target.model,
        drafter,
        ids,
        k=k,
        params=params,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        generator=generator,
    ):
        if not stream.tokens:
            stats.ttft_s = time.perf_counter() - start
        stats.observe_step(step)
        from_draft += step.from_draft
        delta = stream.push(step.tokens, step.finished)
        if on_text and delta:
            on_text(delta)
        if stream.finish_reason:
            break
    stats.wall_s = time.perf_counter() - start
    stats.new_tokens = len(stream.tokens)
    return Result(
        stream.text,
        stream.tokens,
        stats,
        stream.finish_reason or "length",
        prompt_tokens=len(ids),
        from_draft=from_draft[: len(stream.tokens)],
    )

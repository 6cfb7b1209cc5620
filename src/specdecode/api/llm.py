"""LLM: a target with a drafter, loaded once; generate, chat and stream through the batched core.

Many prompts go through decoding/batch_decoder.py, the core the server runs: each request gets a KV
slot, its own copy of the drafter and its own seeded generator, and joins or leaves between steps;
a model without a batched forward (transformers' own) runs its slots in turn inside the same core.
Requests with per-task routing or adaptive k (config, adaptive, routing="auto", state, task) go one
at a time through decoding/router.py, which chooses each one's drafter and k from measured costs.
"""

from __future__ import annotations

import copy
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count

import torch

from specdecode import drafters
from specdecode.api.outputs import CompletionOutput, RequestOutput, StreamDelta
from specdecode.api.params import SamplingParams
from specdecode.api.structured import Compiler
from specdecode.backends import models
from specdecode.backends.batch_model import batched
from specdecode.backends.precision import FP32, Precision
from specdecode.core.metrics import Stats
from specdecode.decoding import batch_decoder
from specdecode.decoding.batch_decoder import BatchDecoder
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.control import FixedK
from specdecode.decoding.generation import check_k, encode_prompt
from specdecode.decoding.prefix_cache import PrefixCache
from specdecode.decoding.step import Step
from specdecode.decoding.text import TextStream
from specdecode.drafters.spec import Spec
from specdecode.errors import UserError

Prompt = str | list[int]  # text, or token ids used as they are


@dataclass(eq=False)
class _Request:
    """One request in flight in the batched core."""

    id: str
    prompt: str | None
    ids: list[int]
    params: SamplingParams
    seq: batch_decoder.Sequence
    text: TextStream
    stats: Stats = field(default_factory=lambda: Stats(prefills=1))
    from_draft: list[bool] = field(default_factory=list)
    start: float = 0.0

    def observe(self, step: Step) -> str:
        """Account one step -> the text it made safe to show."""
        if not self.text.tokens:
            self.stats.ttft_s = time.perf_counter() - self.start
        self.stats.observe_step(step)
        self.stats.draft_s += step.draft_s
        self.stats.verify_s += step.verify_s
        self.from_draft += _provenance(step)
        return self.text.push(step.tokens, step.finished)

    def output(self) -> RequestOutput:
        self.stats.wall_s = time.perf_counter() - self.start
        self.stats.new_tokens = len(self.text.tokens)
        tokens = self.text.tokens
        done = CompletionOutput(
            0,
            self.text.text,
            list(tokens),
            self.text.finish_reason or "length",
            self.from_draft[: len(tokens)],
        )
        return RequestOutput(self.id, self.prompt, self.ids, [done], self.stats)


def _provenance(step: Step) -> list[bool]:
    """A step commits its accepted drafts, then the target's own token (cut after an EOS)."""
    return ([True] * step.accepted + [False])[: len(step.tokens)]


class LLM:
    """A target model with a drafter. model: None (the default SmolLM2-135M-Instruct GGUF), a Hugging
    Face directory, a .gguf file or a hub id; drafter: a spec ("ngram", "eagle", "draft:DIR", ...,
    see `specdecode.drafters`) or a parsed Spec; k: draft tokens per step (the most, when adaptive);
    dtype: fp32, bf16, gguf, gguf-exact or auto (gguf for a GGUF file on CPU, else fp32), or a parsed
    Precision; `llm.precision` is the one it resolved to."""

    def __init__(
        self,
        model: str | None = None,
        drafter: str | Spec = "ngram",
        *,
        k: int = 4,
        adaptive: bool = False,
        dtype: str | Precision = "auto",
        device: str | None = None,
        backend: str = "auto",
        threads: int | None = None,
        target_quant: str = "none",
        drafter_quant: str = "none",
        max_batch: int = 8,
        prefix_cache_mb: int = 256,
        config: str | None = None,
        routing: str = "config",
        state: str | None = None,
    ):
        from transformers.utils import logging as hf_logging

        from specdecode.backends import quant

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self.spec = drafters.parse(drafter)
        self.k, self.adaptive = check_k(k), adaptive
        if max_batch < 1:
            raise UserError(f"max_batch must be >= 1, got {max_batch}")
        if routing not in ("config", "auto"):
            raise UserError(f"routing must be 'config' or 'auto', got {routing!r}")
        if threads is not None:
            if threads < 1:
                raise UserError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        precision = Precision.parse(dtype)
        if precision.auto:
            try:
                precision = models.auto_dtype(model, device, target_quant, backend)
            except UserError:  # an unreadable target: said by load() below
                precision = FP32
        quant.check(target_quant, precision, device)
        quant.check(drafter_quant, precision, device)
        quant.warn_if_lossy(target_quant, self.spec.speculates or bool(config) or routing == "auto")
        if drafter_quant != "none" and not self.spec.draft_models:
            raise UserError(f"drafter_quant applies to draft models (draft, draft:<model>), not {self.spec}")
        self.precision = precision
        self.routing = {"config": config, "auto": routing == "auto", "state": state}
        if config:
            from specdecode.decoding.config import load_config

            load_config(config)  # a bad config fails before the model loads
        self.target = models.load(model, precision, device, backend, target_quant)
        self.tokenizer = self.target.tokenizer
        self.ctx = drafters.DrafterContext(self.target, precision, device, backend, drafter_quant)
        self._router = None
        if config or adaptive or routing == "auto" or state:
            self._router = self._make_router()
        self._drafter = None if self._router else drafters.build(self.spec, self.ctx)
        cache = PrefixCache(max_bytes=prefix_cache_mb << 20) if prefix_cache_mb > 0 else None
        self._core = BatchDecoder(batched(self.target.model, max_batch), cache)
        self._ids = count()
        self._formats = Compiler(self.tokenizer, self.target.model.vocab_size, frozenset(self.target.eos_ids))

    # -- public ----------------------------------------------------------------------------------

    @property
    def routed(self) -> bool:
        """Whether requests go one at a time through the router (config, adaptive k, routing, state)."""
        return self._router is not None

    def with_drafter(self, drafter: str | Spec, k: int | None = None) -> LLM:
        """The same loaded target, batch core and prefix cache with another drafter (and k), fixed k
        and no routing: only the drafter is built (`specdecode audit` compares drafters this way)."""
        other = copy.copy(self)
        other.spec = drafters.parse(drafter)
        other.k = check_k(k) if k is not None else self.k
        other.adaptive, other._router = False, None
        other._drafter = drafters.build(other.spec, self.ctx)
        return other

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool | None = False,
        task: str | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or a list of token ids) -> one RequestOutput per prompt, in
        order. sampling_params: one for all, or one per prompt. chat: apply the model's chat template
        to text prompts (None: when it has one). task: route every prompt as this task (routing)."""
        requests = self._requests(prompts, sampling_params, chat)
        if task is not None or self._router:
            return [self._routed(r, task, chat) for r in requests]
        for _ in self._drive(requests):
            pass
        return [r.output() for r in requests]

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One conversation ([{"role", "content"}, ...]) or a list of them, through the model's chat
        template with the assistant's turn opened -> one RequestOutput per conversation."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        if not getattr(self.tokenizer, "chat_template", None):
            raise UserError("chat needs a model whose tokenizer has a chat template")
        texts = []
        for conversation in conversations:
            if not conversation or not all(isinstance(m, dict) and "content" in m for m in conversation):
                raise UserError("messages: expected a list of {'role': ..., 'content': ...} objects")
            texts.append(
                self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
            )
        ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        outs = self.generate(ids, sampling_params)
        for out, text in zip(outs, texts):
            out.prompt = text
        return outs

    def stream(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        *,
        chat: bool | None = False,
        task: str | None = None,
    ) -> Iterator[StreamDelta]:
        """Generate one completion step by step: a StreamDelta per target forward that committed
        tokens; the last one carries the finished RequestOutput."""
        (request,) = self._requests(prompt if isinstance(prompt, str) else [prompt], sampling_params, chat)
        if task is not None or self._router:
            yield from self._routed_stream(request, task, chat)
            return
        last = None
        for _, step, delta in self._drive([request]):
            if last is not None:
                yield last
            last = StreamDelta(delta, list(step.tokens), _provenance(step))
        last.output = request.output()
        yield last

    # -- the batched core ------------------------------------------------------------------------

    def _requests(self, prompts, params, chat: bool | None) -> list[_Request]:
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and _is_ids(prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise UserError("no prompts")
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        params = list(params)
        if len(params) != len(prompts):
            raise UserError(f"{len(params)} sampling_params for {len(prompts)} prompts")
        return [self._request(p, sp, chat) for p, sp in zip(prompts, params)]

    def _request(self, prompt: Prompt, params: SamplingParams, chat: bool | None) -> _Request:
        if isinstance(prompt, str):
            ids = encode_prompt(self.tokenizer, prompt, chat)
        elif isinstance(prompt, list) and _is_ids(prompt):
            ids = list(prompt)
            vocab = self.target.model.vocab_size
            if bad := [t for t in ids if not 0 <= t < vocab]:
                raise UserError(f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        else:
            raise UserError(f"a prompt is a string or a non-empty list of token ids, got {prompt!r:.60}")
        limit = self.target.model.max_length
        if len(ids) + params.max_tokens > limit:
            raise UserError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"context of {limit} tokens"
            )
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        eos = frozenset() if params.ignore_eos else frozenset(self.target.eos_ids)
        seq = batch_decoder.Sequence(
            ids,
            self._drafter.fork() if self._drafter is not None else None,
            FixedK(self.spec.k(self.k)),
            params.distribution(),
            torch.Generator(device=self.target.model.device).manual_seed(seed),
            params.max_tokens,
            eos,
            constraints=self._constraints(ids, params),
        )
        text = TextStream(self.tokenizer, params.stop, eos)
        return _Request(
            str(next(self._ids)), prompt if isinstance(prompt, str) else None, ids, params, seq, text
        )

    def _constraints(self, ids: list[int], params: SamplingParams) -> Constraints | None:
        """A request's structured outputs as a grammar on the target's distribution (decoding.constraints)."""
        fmt = params.structured_outputs
        return None if fmt is None else Constraints(ids, grammar=self._formats.matcher(fmt))

    def _drive(self, requests: list[_Request]) -> Iterator[tuple[_Request, Step, str]]:
        """Run requests through the batched core, at most max_batch at a time, admitting waiting ones
        as others finish -> (request, step, new text) for every step that committed tokens."""
        core = self._core
        waiting, running = deque(requests), []
        try:
            while waiting or running:
                admitted = [waiting.popleft() for _ in range(min(len(waiting), len(core.free)))]
                if admitted:
                    now = time.perf_counter()
                    for r in admitted:
                        r.start = now
                    prefill_s = core.start([r.seq for r in admitted])
                    for r in admitted:
                        r.stats.prefill_s = prefill_s
                    running += admitted
                steps = core.step([r.seq for r in running])
                for r, step in zip(list(running), steps):
                    if step.error is not None:
                        raise step.error
                    delta = r.observe(step)
                    yield r, step, delta
                    if r.text.finish_reason:
                        core.release(r.seq)
                        running.remove(r)
        finally:  # an error, or a stream abandoned half-way: the slots are free for the next call
            for r in running:
                core.release(r.seq)

    # -- routed requests (config, adaptive k, learned routing): one at a time ----------------------

    def _make_router(self):
        from specdecode.decoding.config import Route, SpecConfig, load_config
        from specdecode.decoding.router import Router
        from specdecode.decoding.taskstate import TaskState

        r = self.routing
        config = (
            load_config(r["config"])
            if r["config"]
            else SpecConfig(default=Route(self.spec, self.k, self.adaptive))
        )
        return Router(self.target, config, self.ctx, TaskState(r["state"]), auto=r["auto"])

    def _route_args(self, request: _Request, task: str | None, chat: bool | None) -> dict:
        from specdecode.core.tasks import TASKS

        if task is not None and task not in TASKS:
            raise UserError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
        p = request.params
        if p.structured_outputs is not None:
            raise UserError("structured_outputs cannot be used with routing, adaptive k or a config (yet)")
        if self._router is None:
            self._router = self._make_router()
        return dict(
            task=task,
            chat=chat,
            params=p.distribution(),
            max_new_tokens=p.max_tokens,
            stop=p.stop,
            seed=request.seq.generator.initial_seed(),
        )

    def _routed(self, request: _Request, task: str | None, chat: bool | None, on_text=None) -> RequestOutput:
        args = self._route_args(request, task, chat)
        prompt = request.prompt if request.prompt is not None else request.ids
        result = self._router.run(prompt, on_text=on_text, ignore_eos=request.params.ignore_eos, **args)
        self._router.state.save()
        done = CompletionOutput(0, result.text, result.token_ids, result.finish_reason, result.from_draft)
        return RequestOutput(
            request.id, request.prompt, request.ids, [done], result.stats, route=result.extra
        )

    def _routed_stream(self, request: _Request, task: str | None, chat: bool | None) -> Iterator[StreamDelta]:
        """The router's loop reports text through a callback: it runs in a thread that hands each
        piece over (torch releases the GIL in its kernels, so nothing runs slower)."""
        pieces: queue.Queue = queue.Queue()

        def run():
            try:
                pieces.put(self._routed(request, task, chat, on_text=pieces.put))
            except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
                pieces.put(e)

        threading.Thread(target=run, name="specdecode-route", daemon=True).start()
        while True:
            item = pieces.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, RequestOutput):
                yield StreamDelta("", [], [], output=item)
                return
            yield StreamDelta(item, [], [])


def _is_ids(prompt: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)

"""LLM: a target with a drafter, loaded once; generate, chat and stream through the engine.

The engine (specdecode/engine: the loop the server runs too) holds the batched target, the drafters and
the policies: every request gets a KV slot, its own copy of its drafter and its own seeded generator,
and joins or leaves between steps; its task picks its route (drafter and k: a config's routes, learned
routing, the per-task history of `state`), adaptive k and grammars ride on it. LLM is a thin client:
it turns prompts and SamplingParams into the engine's Requests, then drives the engine from the
caller's thread (`Engine.iterate`) until they finish, collecting their events.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count

import torch

from specdecode import drafters
from specdecode import engine as eng
from specdecode.api.outputs import CompletionOutput, RequestOutput, StreamDelta
from specdecode.api.params import SamplingParams
from specdecode.api.structured import Compiler
from specdecode.backends import models, registry
from specdecode.backends.precision import FP32, Precision
from specdecode.core.tasks import TASKS, classify
from specdecode.decoding.config import Route, load_config
from specdecode.decoding.generation import check_k, encode_prompt
from specdecode.decoding.taskstate import TaskState
from specdecode.drafters.spec import Spec
from specdecode.errors import UserError

Prompt = str | list[int]  # text, or token ids used as they are


class LLM:
    """A target model with a drafter. model: None (the default SmolLM2-135M-Instruct GGUF), a Hugging
    Face directory, a .gguf file or a hub id; drafter: a spec ("ngram", "eagle", "draft:DIR", ...,
    see `specdecode.drafters`) or a parsed Spec, None for the target's measured best where the
    registry names one (`qwen2.5-coder-1.5b`: n-gram lookup, then its shipped EAGLE head, k 8), else
    "ngram"; k: draft tokens per step (the most, when adaptive), None for the drafter's default (4);
    dtype: fp32, bf16, gguf, gguf-exact or auto (gguf for a GGUF file on CPU, else fp32), or a parsed
    Precision; `llm.precision` is the one it resolved to."""

    def __init__(
        self,
        model: str | None = None,
        drafter: str | Spec | None = None,
        *,
        k: int | None = None,
        adaptive: bool = False,
        dtype: str | Precision = "auto",
        device: str | None = None,
        backend: str = "auto",
        threads: int | None = None,
        target_quant: str = "none",
        drafter_quant: str = "none",
        max_batch: int = 8,
        prefix_cache_mb: int = 256,
        kv_memory: int | None = None,
        kv_dtype: str = "auto",
        config: str | None = None,
        routing: str = "config",
        state: str | None = None,
    ):
        from transformers.utils import logging as hf_logging

        from specdecode.backends import quant

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        if drafter is None or k is None:
            named, k, why = registry.speculation(model, None if drafter is None else str(drafter), k)
            drafter = named if drafter is None else drafter
            if why:
                print(f"specdecode: {why}", file=sys.stderr)
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
        # a bad config or state file fails before the model loads
        routes = load_config(config) if config else eng.default_routes(self.spec, self.k, adaptive)
        if state:
            TaskState(state)
        self.target = models.load(model, precision, device, backend, target_quant)
        self.tokenizer = self.target.tokenizer
        self._routed = bool(config or routing == "auto" or state)
        self._engine = eng.build_engine(
            self.target,
            routes,
            model_name=str(model or models.DEFAULT_TARGET),
            max_batch=max_batch,
            queue_size=sys.maxsize,  # a client's own prompts wait in line, however many
            load_control=self._routed or adaptive,  # adaptive k and realised speedups need the costs
            precision=precision,
            device=device,
            backend=backend,
            drafter_quant=drafter_quant,
            prefix_cache_mb=prefix_cache_mb,
            kv_memory=kv_memory,
            kv_dtype=kv_dtype,
            learned_routing=routing == "auto",
            state=state,
            any_drafter=True,
            chunked_prefill=False,  # each admission's prompts in one forward of their own
        )
        # unrouted requests take the LLM's own drafter and k (with_drafter changes them)
        self._route = None if self._routed else Route(self.spec, self.k, adaptive)
        self._lock = threading.Lock()  # one caller drives the engine at a time
        self._formats = Compiler(self._engine.grammars)
        self._ids = count()

    # -- public ----------------------------------------------------------------------------------

    @property
    def routed(self) -> bool:
        """Whether a request's task picks its route (a config, learned routing or a state file)."""
        return self._routed

    @property
    def engine(self) -> eng.Engine:
        """The engine this LLM drives (its metrics, costs and router)."""
        return self._engine

    def with_drafter(self, drafter: str | Spec, k: int | None = None) -> LLM:
        """The same loaded target and engine with another drafter (and k), fixed k and no routing:
        only the drafter is built (`specdecode audit` compares drafters this way)."""
        other = copy.copy(self)
        other.spec = drafters.parse(drafter)
        other.k = check_k(k) if k is not None else self.k
        other.adaptive, other._routed = False, False
        other._route = Route(other.spec, other.k, False)
        self._engine.pool.template(other.spec)  # built now: a bad spec or model fails here
        return other

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat: bool | None = False,
        task: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or a list of token ids) -> one RequestOutput per prompt, in
        order. sampling_params: one for all, or one per prompt. chat: apply the model's chat template
        to text prompts (None: when it has one). task: every prompt's task, or one per prompt (None:
        classified from its text), which picks its route when the LLM routes."""
        pending = self._submit(prompts, sampling_params, chat, task)
        try:
            while not all(p.finished for p in pending):
                self._iterate(pending)
        finally:
            self._drop(pending)
        return [p.output(self._routed) for p in pending]

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
        """Generate one completion piece by piece: a StreamDelta whenever new text is safe to show,
        with the tokens committed since the last; the last one carries the finished RequestOutput."""
        (pending,) = self._submit(
            prompt if isinstance(prompt, str) else [prompt], sampling_params, chat, task
        )
        try:
            seen = 0
            while True:
                if not pending.finished:
                    self._iterate([pending])
                for delta in pending.deltas[seen:]:
                    yield StreamDelta(delta.text, delta.tokens, delta.from_draft)
                seen = len(pending.deltas)
                if pending.finished:
                    break
            out = pending.output(self._routed)
            rest = slice(sum(len(d.tokens) for d in pending.deltas), None)
            yield StreamDelta("", out.token_ids[rest], out.outputs[0].from_draft[rest], output=out)
        finally:
            self._drop([pending])

    # -- requests into the engine, events out -----------------------------------------------------

    def _submit(self, prompts, params, chat: bool | None, task) -> list[_Pending]:
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
        tasks = [task] * len(prompts) if task is None or isinstance(task, str) else list(task)
        if len(tasks) != len(prompts):
            raise UserError(f"{len(tasks)} tasks for {len(prompts)} prompts")
        if bad := [t for t in tasks if t is not None and t not in TASKS]:
            raise UserError(f"unknown task {bad[0]!r}; known: {', '.join(TASKS)}")
        requests = [self._request(*args, chat) for args in zip(prompts, params, tasks)]  # all checked first
        pending = []
        for prompt, request in zip(prompts, requests):
            text = prompt if isinstance(prompt, str) else None
            p = _Pending(id=str(next(self._ids)), prompt=text, ids=request.prompt)
            p.state = self._engine.submit(request, p.add)
            pending.append(p)
        return pending

    def _request(
        self, prompt: Prompt, params: SamplingParams, task: str | None, chat: bool | None
    ) -> eng.Request:
        if isinstance(prompt, str):
            ids = encode_prompt(self.tokenizer, prompt, chat)
        elif isinstance(prompt, list) and prompt and _is_ids(prompt):
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
        task = task or classify(prompt if isinstance(prompt, str) else self.tokenizer.decode(ids))
        route = self._route or self._engine.route(task)
        fmt = params.structured_outputs
        return eng.Request(
            ids,
            params.distribution(),
            params.max_tokens,
            stop=params.stop,
            seed=params.seed,
            drafter=route.drafter,
            k=route.k,
            adaptive=route.adaptive,
            task=task,
            ignore_eos=params.ignore_eos,
            grammar=None if fmt is None else self._formats.compile(fmt),
        )

    def _iterate(self, pending: list[_Pending]) -> None:
        """One engine iteration (it advances every request in flight, this call's or another's)."""
        with self._lock:
            worked = self._engine.iterate()
        for p in pending:
            p.check()
        if not worked and not all(p.finished for p in pending):
            raise RuntimeError("the engine has no work but requests are unfinished")

    def _drop(self, pending: list[_Pending]) -> None:
        """An error, or a stream abandoned half-way: unfinished requests leave, their slots free."""
        left = [p for p in pending if not p.finished]
        for p in left:
            self._engine.cancel(p.state)
        if left:
            with self._lock:
                self._engine.iterate()


@dataclass(eq=False, kw_only=True)
class _Pending(eng.Collected):
    """One request of this client in the engine, and its events so far."""

    id: str
    prompt: str | None
    ids: list[int]
    state: eng.RequestState | None = None

    def output(self, routed: bool) -> RequestOutput:
        done = self.done
        completion = CompletionOutput(0, self.text, done.tokens, done.finish_reason, done.from_draft)
        return RequestOutput(
            self.id, self.prompt, self.ids, [completion], done.stats, route=done.route if routed else {}
        )


def _is_ids(prompt: list) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)

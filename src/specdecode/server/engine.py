"""The serving engine: continuous batching of speculative decoding in one scheduler thread.

Each iteration of the loop:
  1. drops cancelled and timed-out requests (their slots are free again);
  2. admits waiting requests into free slots and prefills their prompts (one batched forward);
  3. asks every running request's drafter for up to k tokens (k from its policy, capped for the
     current batch size by the measured cost model, see load.py);
  4. runs ONE batched target forward over every running request's [last token, drafts] (ragged);
  5. verifies each row with the request's own generator, rolls its slot back past the rejected
     drafts, commits tokens, detokenizes, checks stop strings and delivers text.
Steps 3-5 are decoder.decode's step, row by row, so a request's greedy output is the one it gets
alone; requests join and leave between iterations. Events reach the API through `sink`, a
callable the caller makes thread-safe.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

import torch

from specdecode.batch_model import BatchLM, Row
from specdecode.control import CostModel, FixedK, KPolicy, adaptive_k
from specdecode.decoder import Step
from specdecode.drafters.base import Drafter
from specdecode.drafters.spec import parse
from specdecode.generation import _StopScanner
from specdecode.metrics import Stats
from specdecode.sampling import SamplingParams, warp
from specdecode.server.drafting import DrafterPool
from specdecode.server.load import BatchCosts
from specdecode.server.metrics import ServerMetrics
from specdecode.verify import verify_greedy, verify_rejection

log = logging.getLogger("specdecode.server")


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None
    drafter: str = "ngram"  # "none": no speculation
    k: int = 4  # fixed k, or the largest k adaptive control may choose
    adaptive: bool = False
    task: str = "creative"
    ignore_eos: bool = False
    timeout_s: float | None = None


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

    def to_json(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "speculative": {
                "drafter": self.drafter, "task": self.task, "k": self.k, "num_drafts": self.num_drafts,
                "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
            },
        }


@dataclass
class Delta:
    text: str


@dataclass
class Done:
    finish_reason: str  # "stop", "length" (OpenAI) or "abort" (cancelled)
    usage: Usage


@dataclass
class Failed:
    status: int
    type: str
    message: str


Event = Delta | Done | Failed


class QueueFull(Exception):
    pass


class ShuttingDown(Exception):
    pass


@dataclass(eq=False)
class Sequence:
    """One request inside the engine (engine-thread state, except the `cancelled` flag)."""

    id: int
    request: Request
    sink: Callable[[Event], None]
    drafter: Drafter
    policy: KPolicy
    generator: torch.Generator
    arrival: float
    scanner: _StopScanner
    slot: int | None = None
    context: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    streamed: int = 0
    stats: Stats = field(default_factory=lambda: Stats(prefills=1))
    num_drafts: int = 0
    last_delivery: float | None = None
    cancelled: bool = False

    @property
    def deadline(self) -> float | None:
        t = self.request.timeout_s
        return None if t is None else self.arrival + t


class Engine:
    def __init__(self, model: BatchLM, tokenizer, eos_ids: set[int], pool: DrafterPool, metrics: ServerMetrics,
                 *, queue_size: int = 64, costs: BatchCosts | None = None, threads: int | None = None):
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, set(eos_ids)
        self.pool, self.metrics, self.costs = pool, metrics, costs
        self.queue_size = queue_size
        self.threads = threads or torch.get_num_threads()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free = list(range(model.slots - 1, -1, -1))  # pop() hands out the lowest slot first
        self.cv = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.ids = count(1)
        self.spec_stats: dict[str, Stats] = {}  # per drafter: acceptance profile for load control
        self.draft_s_per_token: dict[str, float] = {}

    # -- API side (any thread) ----------------------------------------------------------------

    def submit(self, request: Request, sink: Callable[[Event], None]) -> Sequence:
        seq = Sequence(
            next(self.ids), request, sink, self.pool.instance(request.drafter), self._policy(request),
            torch.Generator().manual_seed(request.seed if request.seed is not None else secrets.randbits(63)),
            time.perf_counter(), _StopScanner(request.stop),
        )
        with self.cv:
            if self.stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self.waiting) >= self.queue_size:
                raise QueueFull(f"the request queue is full ({self.queue_size} waiting)")
            self.waiting.append(seq)
            self._gauges()
            self.cv.notify()
        return seq

    def cancel(self, seq: Sequence) -> None:
        with self.cv:
            seq.cancelled = True
            self.cv.notify()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="specdecode-engine", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new requests, fail the ones still queued or running (503), stop the thread."""
        with self.cv:
            self.stopping = True
            self.cv.notify()
        if self.thread is not None:
            self.thread.join(timeout)
        else:  # never started: nothing else will answer the queued requests
            with self.cv:
                self._fail_all()

    # -- engine thread --------------------------------------------------------------------------

    def _policy(self, request: Request) -> KPolicy:
        spec = parse(request.drafter)
        if not request.adaptive or not spec.speculates:
            return FixedK(spec.k(request.k))
        cost = self.costs.cost(1, self.draft_s_per_token.get(request.drafter, 0.0), request.k) if self.costs \
            else CostModel(0.0, {})
        known = self.spec_stats.get(request.drafter)
        return adaptive_k(cost, request.k, known.conditional_acceptance if known and known.drafted >= 32 else None)

    def _gauges(self) -> None:
        self.metrics.set_queue(len(self.running), len(self.waiting))

    def _loop(self) -> None:
        torch.set_num_threads(self.threads)
        while True:
            with self.cv:
                while not (self.stopping or self.waiting or self.running):
                    self.cv.wait()
                if self.stopping:
                    break
                self._sweep()
                admitted = []
                while self.waiting and self.free:
                    seq = self.waiting.popleft()
                    seq.slot = self.free.pop()
                    self.running.append(seq)
                    admitted.append(seq)
                self._gauges()
            try:
                if admitted:
                    self._prefill(admitted)
                if self.running:
                    self._step()
            except Exception as e:  # a bug must not take the server down: fail this batch, go on
                log.exception("engine step failed")
                with self.cv:
                    for seq in list(self.running):
                        self._finish(seq, "error", Failed(500, "internal_error", f"engine error: {e}"))
        with self.cv:
            self._fail_all()

    def _fail_all(self) -> None:
        for seq in list(self.running) + list(self.waiting):
            self._finish(seq, "abort", Failed(503, "service_unavailable", "the server is shutting down"))

    def _sweep(self) -> None:
        """Under the lock: drop cancelled and timed-out requests, waiting or running."""
        now = time.perf_counter()
        for seq in list(self.waiting) + list(self.running):
            if seq.cancelled:
                self._finish(seq, "abort", Done("abort", self._usage(seq)))
            elif seq.deadline is not None and now > seq.deadline:
                self._finish(seq, "timeout", Failed(408, "timeout", f"request timed out after {seq.request.timeout_s} s"))

    def _finish(self, seq: Sequence, reason: str, event: Event) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self.model.truncate(seq.slot, 0)
            self.free.append(seq.slot)
            self.free.sort(reverse=True)
        self.metrics.observe_finish(reason, time.perf_counter() - seq.arrival)
        self._gauges()
        seq.sink(event)

    def _prefill(self, admitted: list[Sequence]) -> None:
        rows = []
        for seq in admitted:
            prompt = seq.request.prompt
            seq.context = list(prompt)
            seq.drafter.begin(prompt)
            self.metrics.prompt_tokens.labels(self.metrics.model_name).inc(len(prompt))
            if len(prompt) > 1:
                rows.append(Row(seq.slot, torch.tensor(prompt[:-1], dtype=torch.long), num_logits=1))
        t0 = time.perf_counter()
        if rows:
            self.model.forward(rows)
        for seq in admitted:
            seq.stats.prefill_s = time.perf_counter() - t0

    def _k(self, seq: Sequence, batch: int) -> int:
        k = seq.policy.next_k()
        spec = seq.request.drafter
        known = self.spec_stats.get(spec)
        if self.costs is not None and k > 0 and known is not None and known.drafted >= 32:
            k = min(k, self.costs.cap(batch, known.conditional_acceptance, k, self.draft_s_per_token.get(spec, 0.0)))
        return min(k, seq.request.max_tokens - len(seq.context) + len(seq.request.prompt) - 1)

    def _step(self) -> None:
        active = list(self.running)
        rows, drafts, proposals, draft_times, bases = [], [], [], [], []
        for seq in active:
            budget = self._k(seq, len(active))
            t0 = time.perf_counter()
            proposal = seq.drafter.propose(seq.context, budget, seq.request.params, seq.generator) if budget > 0 else None
            draft = proposal.tokens[:budget] if proposal is not None else torch.empty(0, dtype=torch.long)
            draft_times.append(time.perf_counter() - t0)
            proposals.append(proposal)
            drafts.append(draft)
            bases.append(self.model.length(seq.slot))
            rows.append(Row(seq.slot, torch.cat([torch.tensor(seq.context[-1:]), draft])))
        t0 = time.perf_counter()
        all_logits = self.model.forward(rows)
        forward_s = time.perf_counter() - t0
        tokens = sum(r.tokens.shape[0] for r in rows)
        if self.costs is not None:
            self.costs.observe(len(rows), round(tokens / len(rows)), forward_s)
        self.metrics.batch_size.labels(self.metrics.model_name).observe(len(rows))
        for seq, draft, proposal, logits, base, draft_s in zip(active, drafts, proposals, all_logits, bases, draft_times):
            verdict = self._verify(seq, draft, proposal, logits)
            self.model.truncate(seq.slot, base + 1 + verdict.accepted)
            seq.drafter.observe(len(draft), verdict.accepted)
            self._commit(seq, draft[: verdict.accepted].tolist() + [verdict.next_token],
                         Step([], len(draft), verdict.accepted, draft_s, forward_s))

    def _verify(self, seq: Sequence, draft, proposal, logits):
        params = seq.request.params
        if params.greedy:
            return verify_greedy(draft.to(logits.device), logits)
        q = proposal.probs[: len(draft)] if proposal is not None and proposal.probs is not None else None
        return verify_rejection(draft.to(logits.device), q, warp(logits, params), seq.generator)

    def _commit(self, seq: Sequence, new: list[int], step: Step) -> None:
        req = seq.request
        eos = set() if req.ignore_eos else self.eos_ids
        for i, token in enumerate(new):
            if token in eos:
                new = new[: i + 1]
                break
        seq.context.extend(new)
        generated = len(seq.context) - len(req.prompt)
        finished = generated >= req.max_tokens or new[-1] in eos
        step.tokens, step.finished = new, finished
        seq.policy.observe(step)
        self._account(seq, step)

        seq.out.extend(new)
        text = self.tokenizer.decode(seq.out, skip_special_tokens=True)
        cut = seq.scanner.find(text)
        reason = "length"
        if cut >= 0:
            text, reason = text[:cut], "stop"
            while len(seq.out) > 1 and seq.scanner.find(self.tokenizer.decode(seq.out[:-1], skip_special_tokens=True)) >= 0:
                seq.out.pop()
        elif finished and new[-1] in eos:
            reason = "stop"
        end = len(text) if (cut >= 0 or finished) else seq.scanner.safe_prefix(text)
        if end > seq.streamed:
            seq.sink(Delta(text[seq.streamed:end]))
            seq.streamed = end
        if cut >= 0 or finished:
            with self.cv:
                self._finish(seq, reason, Done(reason, self._usage(seq)))

    def _account(self, seq: Sequence, step: Step) -> None:
        """One definition of what a step adds: request usage, engine-wide stats, Prometheus."""
        spec, now = seq.request.drafter, time.perf_counter()
        seq.stats.observe(step.drafted, step.accepted, len(step.tokens))
        seq.num_drafts += step.drafted > 0
        self.spec_stats.setdefault(spec, Stats()).observe(step.drafted, step.accepted, len(step.tokens))
        if step.drafted:
            per_token = step.draft_s / step.drafted
            old = self.draft_s_per_token.get(spec)
            self.draft_s_per_token[spec] = per_token if old is None else 0.9 * old + 0.1 * per_token
        self.metrics.observe_step(seq.request.task, spec, step.drafted, step.accepted, len(step.tokens))
        first = seq.last_delivery is None
        self.metrics.observe_delivery(now - (seq.arrival if first else seq.last_delivery), len(step.tokens), first)
        seq.last_delivery = now

    def _usage(self, seq: Sequence) -> Usage:
        r = seq.request
        return Usage(len(r.prompt), len(seq.out), r.drafter, r.task, r.k, seq.num_drafts,
                     seq.stats.drafted, seq.stats.accepted)

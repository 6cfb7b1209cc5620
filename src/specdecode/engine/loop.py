"""The engine: the one scheduler/step loop around the batched decoding core. The server runs it in
its own thread (`start`); the Python API (api/llm.py) and through it the command line drive it from
the caller's thread, one `iterate` at a time. Everything a request gets is decided here, once:

Each iteration:
  1. drops cancelled and timed-out requests (their slots are free again);
  2. claims cache memory for the running requests' next step, preempting the last admitted where it
     runs short (they wait at the front of the queue and recompute their output when readmitted:
     the same output), then admits waiting requests into free slots; the core prefills their
     prompts (in chunks beside the others' steps: decoding/prefill.py);
  3. runs one step of the core (decoding/batch_decoder.py: decoder.decode's step for every running
     request, one batched target forward), each request's k from its policy (fixed, or adaptive
     from measured costs and its task's history) capped for the current batch size (load.py);
  4. accounts each request's step (its Stats, usage, engine-wide acceptance, Prometheus) and
     delivers its new text (decoding/text.py: detokenizing, stop strings, what is safe to stream).
Routing (decoding/router.py: a task's drafter and k, learned routing) is asked through `route` and
told what each finished request did. Constraints (penalties, grammars), logprobs and seeds ride on
the request. Requests join and leave between iterations. Events (request.py) reach the client
through the request's `sink`, a callable the client makes thread-safe.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from itertools import count

import torch

from specdecode.backends.batch_model import BatchLM
from specdecode.core.metrics import Stats
from specdecode.decoding import batch_decoder
from specdecode.decoding.batch_decoder import BatchDecoder
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.control import CostModel, FixedK, KPolicy, adaptive_k
from specdecode.decoding.prefill import PREFILL_BUDGET, PrefillBudget
from specdecode.decoding.prefix_cache import PrefixCache
from specdecode.decoding.router import Router
from specdecode.decoding.step import Step
from specdecode.decoding.text import TextStream
from specdecode.drafters.spec import Spec
from specdecode.engine.capture import Capture
from specdecode.engine.drafting import DrafterPool
from specdecode.engine.load import BatchCosts
from specdecode.engine.metrics import ServerMetrics
from specdecode.engine.per_spec import PerSpec
from specdecode.engine.request import (
    Delta,
    Done,
    Event,
    Failed,
    QueueFull,
    Request,
    RequestState,
    ShuttingDown,
    TooLarge,
    Usage,
)
from specdecode.engine.trace import StepRecord, StepTrace
from specdecode.errors import UserError

log = logging.getLogger("specdecode.engine")


class Engine:
    def __init__(
        self,
        model: BatchLM,
        tokenizer,
        eos_ids: set[int],
        pool: DrafterPool,
        metrics: ServerMetrics,
        *,
        queue_size: int = 64,
        costs: BatchCosts | None = None,
        load_control: bool = True,  # cap k for the batch size from `costs` (else they price rows only)
        threads: int | None = None,
        prefill_budget: int = PREFILL_BUDGET,
        prefix_cache: PrefixCache | None = None,
        router: Router | None = None,  # routes per task (SpecConfig), learned routing, task history
        trace: StepTrace | None = None,  # record each step's timing and rows (trace.py)
        chunked_prefill: bool = True,  # prompts go in chunks beside the others' steps (prefill.py)
    ):
        self.model, self.tokenizer, self.eos_ids = model, tokenizer, set(eos_ids)
        self.router = router or Router(SpecConfig())
        config = self.router.config  # its k_by_batch_size caps a batch's k
        self.k_for_batch = config.k_for_batch if config.k_by_batch_size else None
        # long prompts go in chunks beside the others' steps, at most prefill_budget of work a step
        self.core = BatchDecoder(model, prefix_cache, PrefillBudget(prefill_budget))
        self.pool, self.metrics, self.costs, self.load_control = pool, metrics, costs, load_control
        self.queue_size = queue_size
        self.threads = threads or torch.get_num_threads()
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.cv = threading.Condition()
        self.stopping = False
        self.held = 0  # paused(): the scheduler waits at the top of its loop while > 0
        self.thread: threading.Thread | None = None
        self.ids = count(1)
        # per drafter (bounded by the configuration: per_spec.py): acceptance profile and drafting time
        self.spec_stats: PerSpec[Stats] = PerSpec(pool.configured)
        self.draft_s_per_token: PerSpec[float] = PerSpec(pool.configured)
        self._grammars = None
        self.trace, self.chunked_prefill = trace, chunked_prefill

    # -- API side (any thread) ----------------------------------------------------------------

    @property
    def free(self) -> list[int]:
        """KV slots not in use."""
        return self.core.free

    def cost(self, spec: Spec, k_max: int, batch: int = 1) -> CostModel:
        """One request's costs with this drafter at this batch size, as adaptive k and load control
        price k: the target's forwards measured at start-up and refreshed by every step (load.py), and
        the drafter's time per drafted token in this engine's steps; empty without measured costs."""
        if self.costs is None:
            return CostModel(0.0, {})
        return self.costs.cost(batch, self.draft_s_per_token.get(spec) or 0.0, k_max)

    def route(self, task: str) -> Route:
        """The drafter and k a request of this task takes unless it names its own (router.py)."""
        return self.router.choose(task)

    def submit(self, request: Request, sink: Callable[[Event], None]) -> RequestState:
        eos = frozenset() if request.ignore_eos else frozenset(self.eos_ids)
        generator = torch.Generator(device=self.model.device).manual_seed(
            request.seed if request.seed is not None else secrets.randbits(63)
        )
        drafter = self.pool.instance(request.drafter, request.scope)
        capture = Capture(drafter, self._capture_layers(request)) if request.capture else None
        dec = batch_decoder.Sequence(
            request.prompt,
            capture or drafter,
            self._policy(request),
            request.params,
            generator,
            request.max_tokens,
            eos,
            constraints=self._constraints(request),
            logprobs=request.logprobs,
        )
        seq = RequestState(
            next(self.ids),
            request,
            sink,
            dec,
            time.perf_counter(),
            TextStream(self.tokenizer, request.stop, eos),
            capture=capture,
        )
        room = self.core.room(len(request.prompt))
        if request.max_tokens > room:
            raise TooLarge(
                f"prompt ({len(request.prompt)} tokens) + max_tokens ({request.max_tokens}) needs more KV "
                f"cache than this engine has: at most {max(room, 0)} new tokens after this prompt "
                f"({self.model.capacity} positions; serve --kv-memory)"
            )
        with self.cv:
            if self.stopping:
                raise ShuttingDown("the server is shutting down")
            # running + waiting against slots + queue, not waiting against the queue: requests stay in
            # `waiting` until the scheduler thread next moves them into free slots, and a burst that
            # comes before it does must still find its B + Q places
            if len(self.running) + len(self.waiting) >= self.model.slots + self.queue_size:
                raise QueueFull(f"the request queue is full ({self.queue_size} waiting)")
            self.waiting.append(seq)
            self._gauges()
            self.cv.notify()
        return seq

    def _capture_layers(self, request: Request) -> tuple[int, ...]:
        """Request.capture checked against the target's layers (lm.Output's ids: -1 the final norm's);
        a bad one is the request's error (UserError), not the batch's."""
        n = self.model.num_layers
        if not all(-n <= i < n for i in request.capture):
            raise UserError(
                f"capture: layers {list(request.capture)} out of range for a target of {n} layers"
            )
        return request.capture

    def grammars(self):
        """The structured-output compiler for this tokenizer (decoding/grammar.py), made on first use."""
        if self._grammars is None:
            from specdecode.decoding.grammar import Grammars  # llguidance loads only when a request needs it

            self._grammars = Grammars(self.tokenizer, self.model.vocab_size, self.eos_ids)
        return self._grammars

    def _constraints(self, request: Request) -> Constraints | None:
        grammar = self.grammars().matcher(request.grammar) if request.grammar is not None else None
        if grammar is None and (request.penalties is None or not request.penalties.active):
            return None
        return Constraints(request.prompt, request.penalties, grammar)

    def cancel(self, seq: RequestState) -> None:
        with self.cv:
            seq.cancelled = True
            self.cv.notify()

    @contextmanager
    def paused(self):
        """Park the scheduler at the top of its next iteration, with the lock released: the API side
        (submit, cancel, stop, metrics) keeps working and `stop` still ends the loop, but no request is
        admitted or stepped until the block exits (tests use it to keep requests deterministically in
        flight; the current step, if any, finishes first)."""
        with self.cv:
            self.held += 1
        try:
            yield
        finally:
            with self.cv:
                self.held -= 1
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
        spec = request.drafter
        if not request.adaptive or not spec.speculates or request.seed is not None:
            # a seeded request keeps a fixed k: adaptive k follows measured timings and other requests'
            # acceptance, and a different k consumes its generator differently (not reproducible)
            return FixedK(spec.k(request.k))
        cost = self.cost(spec, request.k)
        known = self.spec_stats.get(request.drafter)
        prior = self.router.prior(request.task, request.drafter)
        if prior is None and known is not None and known.drafted >= 32:
            prior = known.conditional_acceptance
        return adaptive_k(cost, request.k, prior)

    def _gauges(self) -> None:
        self.metrics.set_queue(len(self.running), len(self.waiting))
        self.metrics.set_cache(*self.model.cache_use())

    def _loop(self) -> None:
        torch.set_num_threads(self.threads)
        while True:
            with self.cv:
                while not (self.stopping or (not self.held and (self.waiting or self.running))):
                    self.cv.wait()
                if self.stopping:
                    break
            self.iterate()
        with self.cv:
            self._fail_all()

    def iterate(self) -> bool:
        """One iteration of the loop (sweep, admit, prefill, step, deliver) -> whether it had work.
        The server's thread calls it; a client without that thread (LLM) calls it itself."""
        with self.cv:
            self._sweep()
            self._preempt()
            admitted = []
            while self.free:
                seq = next((s for s in self.waiting if self._ready(s)), None)
                if seq is None or not self.core.admit(seq.dec):  # first come, first served: no cache
                    break  # memory for the first waits for the running ones to end
                self.waiting.remove(seq)
                self.running.append(seq)
                admitted.append(seq)
            self._gauges()
        if not self.running:
            return False
        try:
            t0, began = time.perf_counter(), time.time()
            if admitted:
                self._prefill(admitted)
            self._step(t0, began)
        except Exception as e:  # a bug must not take the server down: fail this batch, go on
            log.exception(
                "engine step failed (requests %s)", " ".join(s.request.request_id for s in self.running)
            )
            with self.cv:
                for seq in list(self.running):
                    self._finish(seq, "error", Failed(500, "internal_error", f"engine error: {e}", e))
        return True

    def _preempt(self) -> None:
        """Under the lock: the running requests' next step gets its cache memory; those the core
        preempts for it go back to the front of the queue, first admitted first."""
        of = {seq.dec: seq for seq in self.running}
        for dec in self.core.reserve([seq.dec for seq in self.running]):
            seq = of[dec]
            self.running.remove(seq)
            self.waiting.appendleft(seq)
            self.metrics.preemptions.labels(self.metrics.model_name).inc()
            log.info(
                "request %s preempted after %d tokens (KV cache memory)", seq.request.request_id, len(seq.out)
            )

    def _ready(self, seq: RequestState) -> bool:
        """Under the lock: a sibling of an n > 1 request starts once the first has its prompt's KV in
        the prefix cache (or is gone), so that it prefills only the last partial block."""
        first = seq.request.after
        if first is None or self.core.prefix_cache is None:
            return True
        return first not in self.waiting and not (first.dec.slot is not None and first.dec.prefilling)

    def _fail_all(self) -> None:
        for seq in list(self.running) + list(self.waiting):
            self._finish(seq, "abort", Failed(503, "service_unavailable", "the server is shutting down"))

    def _sweep(self) -> None:
        """Under the lock: drop cancelled and timed-out requests, waiting or running."""
        now = time.perf_counter()
        for seq in list(self.waiting) + list(self.running):
            if seq.cancelled:
                self._finish(seq, "abort", self._done(seq, "abort"))
            elif seq.deadline is not None and now > seq.deadline:
                self._finish(
                    seq,
                    "timeout",
                    Failed(408, "timeout", f"request timed out after {seq.request.timeout_s} s"),
                )

    def _finish(self, seq: RequestState, reason: str, event: Event) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self.core.release(seq.dec)
        e2e = time.perf_counter() - seq.arrival
        self.metrics.observe_finish(reason, e2e)
        self._gauges()
        log.info(
            "request %s finished (%s) after %.3f s, %d tokens",
            seq.request.request_id,
            reason,
            e2e,
            len(seq.out),
        )
        seq.sink(event)

    def _prefill(self, admitted: list[RequestState]) -> None:
        for seq in admitted:
            if not seq.dec.preempted:  # a resumed one's recomputed tokens are not prompt tokens
                self.metrics.prompt_tokens.labels(self.metrics.model_name).inc(len(seq.request.prompt))
        cache = self.core.prefix_cache
        before = (cache.queries, cache.hits) if cache else (0, 0)
        prefill_s = self.core.start([seq.dec for seq in admitted], chunked=self.chunked_prefill)
        if cache:
            self.metrics.observe_prefix(cache.queries - before[0], cache.hits - before[1])
        for seq in admitted:
            seq.stats.prefill_s = prefill_s

    def _limit(self, seq: RequestState, k: int) -> int:
        """k for this request at the current batch size: capped by the measured cost model."""
        spec = seq.request.drafter
        known = self.spec_stats.get(spec)
        if seq.request.seed is not None:
            return k  # load control leaves a seeded request's k alone: same text alone and in a full batch
        if self.k_for_batch is not None:
            k = self.k_for_batch(len(self.running), k)
        if self.load_control and self.costs is not None and known is not None and known.drafted >= 32:
            k = min(
                k,
                self.costs.cap(
                    len(self.running),
                    known.conditional_acceptance,
                    k,
                    self.draft_s_per_token.get(spec) or 0.0,
                ),
            )
        return k

    def _step(self, t0: float, began: float) -> None:
        """One step of the core for every running request, then their accounting and delivery; t0
        (perf_counter) and began (Unix time): when this iteration began, for the trace."""
        active = list(self.running)
        of = {seq.dec: seq for seq in active}
        prefilled = [seq.dec.prefilled for seq in active] if self.trace is not None else []
        steps = self.core.step([seq.dec for seq in active], lambda dec, k: self._limit(of[dec], k))
        decoded = [step for step in steps if step.error is None and not step.prefilling]
        if self.costs is not None and decoded and len(decoded) == len(steps):  # a step without prefill rows
            tokens = sum(step.drafted + 1 for step in decoded)
            self.costs.observe(len(steps), round(tokens / len(steps)), steps[0].verify_s)
        self.metrics.batch_size.labels(self.metrics.model_name).observe(len(steps))
        for seq, step in zip(active, steps):
            if step.error is not None:  # this request's row failed; the rest of the batch goes on
                log.error("request %s failed in its step: %r", seq.request.request_id, step.error)
                with self.cv:
                    failure = Failed(500, "internal_error", f"engine error: {step.error}", step.error)
                    self._finish(seq, "error", failure)
                continue
            if step.prefilling:  # its prompt is still going in, chunk by chunk
                continue
            self._account(seq, step)
            delta = seq.text.push(step.tokens, step.finished)
            seq.logprobs += step.logprobs or []
            if delta:
                new = slice(seq.delivered, len(seq.out))
                seq.sink(Delta(delta, seq.logprobs, seq.out[new], seq.from_draft[new]))
                seq.logprobs, seq.delivered = [], len(seq.out)
            if reason := seq.text.finish_reason:
                with self.cv:
                    self._finish(seq, reason, self._done(seq, reason))
        if self.trace is not None:
            prompt = [seq.dec.prefilled - n for seq, n in zip(active, prefilled) if seq.dec.prefilled > n]
            self.trace.add(
                StepRecord(
                    began,
                    time.perf_counter() - t0,
                    steps[0].verify_s if steps else 0.0,  # every row of a batched step carries its forward's
                    len(decoded),
                    len(prompt),
                    sum(prompt),
                )
            )

    def _account(self, seq: RequestState, step: Step) -> None:
        """One definition of what a step adds: request usage, engine-wide stats, Prometheus."""
        spec, now = seq.request.drafter, time.perf_counter()
        if seq.last_delivery is None:
            seq.stats.ttft_s = now - seq.arrival
        seq.stats.observe_step(step)
        seq.from_draft += step.from_draft
        seq.num_drafts += step.drafted > 0
        self.spec_stats.setdefault(spec, Stats).observe_step(step)
        if step.drafted:
            per_token = step.draft_s / step.drafted
            old = self.draft_s_per_token.get(spec)
            self.draft_s_per_token.put(spec, per_token if old is None else 0.9 * old + 0.1 * per_token)
        self.metrics.observe_step(
            seq.request.task, spec, step.drafted, step.accepted, len(step.tokens), step.depth
        )
        first = seq.last_delivery is None
        self.metrics.observe_delivery(
            now - (seq.arrival if first else seq.last_delivery), len(step.tokens), first
        )
        seq.last_delivery = now

    def _usage(self, seq: RequestState) -> Usage:
        r = seq.request
        return Usage(
            len(r.prompt),
            len(seq.out),
            str(r.drafter),
            r.task,
            r.k,
            seq.num_drafts,
            seq.stats.drafted,
            seq.stats.accepted,
            seq.stats.steps,
            list(seq.stats.accepted_by_pos),
        )

    def _done(self, seq: RequestState, reason: str) -> Done:
        """A request's end: its completion, Stats and usage; a completed one (not aborted) is told to
        the router with its realised speedup, measured against a plain step's cost (load.py)."""
        r, stats = seq.request, seq.stats
        stats.wall_s = time.perf_counter() - seq.arrival
        stats.new_tokens = len(seq.out)
        route = {"task": r.task, "drafter": str(r.drafter), "k": r.k, "adaptive": r.adaptive}
        if reason in ("stop", "length"):
            step_s = self.costs.cost(1).step_s if self.costs is not None else None
            route["realised_speedup"] = self.router.observe(r.task, r.drafter, stats, step_s)
        out = list(seq.out)
        complete = seq.capture is not None and reason in ("stop", "length")  # an abort may stop mid-prefill
        features = seq.capture.rows(len(r.prompt) + len(out) - 1) if complete else None
        return Done(
            reason, self._usage(seq), seq.logprobs, out, seq.from_draft[: len(out)], stats, route, features
        )

"""Server metrics, defined once, exported as Prometheus text (/metrics) and JSON (/stats).

Speculation counters mean what vLLM's `vllm:spec_decode_*` counters mean, under the prefix
`specdecode:`, with labels `task` and `drafter`:
- num_drafts: verify steps that carried at least one draft token;
- num_draft_tokens: draft tokens proposed; num_accepted_tokens: draft tokens kept;
- num_accepted_tokens_per_pos{position=i}: steps whose draft at position i (0-based) was kept;
- num_drafted_tokens_per_pos{position=i} (ours only): steps whose draft reached position i (a tree
  counts once per depth), so that variable-length drafts (n-gram, suffix) give acceptance at i among
  the drafts that had an i-th token, where vLLM's counters only allow dividing by all drafts.
So α = accepted / draft_tokens and τ (mean acceptance length, bonus included) = 1 + accepted / drafts,
computed by specdecode.core.metrics (the one definition the CLI and bench use too). /stats is computed from
these same counters, so the two views cannot disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdecode.core import metrics
from specdecode.drafters.spec import Spec, parse

PREFIX = "specdecode:"
_LATENCY = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


class DrafterLabels:
    """The `drafter` label of a spec, from the server's configuration: a drafter the server was started
    with (its routes' and candidates' specs) is labelled by its canonical spec; any other spec a request
    names is honoured but labelled by its kind (`ngram:1-100000` -> `ngram`). So the label values are
    bounded by the configuration and the drafter kinds, whatever clients send, and no client spec can
    take a configured drafter's label."""

    def __init__(self, configured: Iterable[str | Spec]):
        self.configured = frozenset(str(parse(s)) for s in configured)

    def __call__(self, spec: str | Spec) -> str:
        parsed = spec if isinstance(spec, Spec) else parse(spec)  # a request's Spec: parsed once already
        text = str(parsed)
        return text if text in self.configured else parsed.kind


class ServerMetrics:
    def __init__(self, model_name: str, drafters: Iterable[str | Spec] = ()):
        """drafters: the specs the server was started with (metric labels of their own)."""
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.drafter_label = DrafterLabels(drafters)
        self._speculation_metrics(self.registry)  # registered in the order /metrics lists them
        self._request_metrics(self.registry)
        self._latency_metrics(self.registry)
        # exported at 0 from the start, so that rate() sees the first
        self.rejected.labels(model_name, "queue_full")
        self.observe_prefix(0, 0)
        self.set_queue(0, 0)
        self.set_cache(0.0, 0)

    def _speculation_metrics(self, r: CollectorRegistry) -> None:
        """vLLM's spec_decode counters (module docstring), labelled by task and drafter."""
        spec = ["model_name", "task", "drafter"]
        self.drafts = Counter(
            PREFIX + "spec_decode_num_drafts", "Verify steps with at least one draft token", spec, registry=r
        )
        self.draft_tokens = Counter(
            PREFIX + "spec_decode_num_draft_tokens", "Draft tokens proposed", spec, registry=r
        )
        self.accepted = Counter(
            PREFIX + "spec_decode_num_accepted_tokens", "Draft tokens accepted", spec, registry=r
        )
        self.accepted_per_pos = Counter(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by draft position (0-based)",
            spec + ["position"],
            registry=r,
        )
        self.drafted_per_pos = Counter(
            PREFIX + "spec_decode_num_drafted_tokens_per_pos",
            "Drafts that reached draft position i (0-based; a tree once per depth)",
            spec + ["position"],
            registry=r,
        )
        self.steps = Counter(
            PREFIX + "spec_decode_num_steps",
            "Verify steps, with or without drafts (a step without "
            "drafts is plain decoding: fallback or k = 0)",
            spec,
            registry=r,
        )

    def _request_metrics(self, r: CollectorRegistry) -> None:
        """Requests refused, running, waiting and finished; prefix cache lookups; tokens."""
        self.rejected = Counter(
            PREFIX + "num_requests_rejected",
            "Requests refused before decoding (queue full)",
            ["model_name", "reason"],
            registry=r,
        )
        self.prefix_queries = Counter(
            PREFIX + "prefix_cache_queries",
            "Prompt KV blocks looked up in the prefix cache",
            ["model_name"],
            registry=r,
        )
        self.prefix_hits = Counter(
            PREFIX + "prefix_cache_hits",
            "Prompt KV blocks found in the prefix cache",
            ["model_name"],
            registry=r,
        )
        self.running = Gauge(
            PREFIX + "num_requests_running", "Requests holding a batch slot", ["model_name"], registry=r
        )
        self.waiting = Gauge(
            PREFIX + "num_requests_waiting", "Requests queued for a slot", ["model_name"], registry=r
        )
        self.cache_usage = Gauge(
            PREFIX + "kv_cache_usage_perc",
            "Fraction of the KV cache's blocks in use (1 = full)",
            ["model_name"],
            registry=r,
        )
        self.cache_backed = Gauge(
            PREFIX + "kv_cache_backed_bytes",
            "KV cache memory written so far (its pages stay resident): the cache's high-water mark",
            ["model_name"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prefilled prompt tokens", ["model_name"], registry=r
        )
        self.preemptions = Counter(
            PREFIX + "num_preemptions",
            "Requests preempted for KV cache memory (their output recomputed when readmitted)",
            ["model_name"],
            registry=r,
        )
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens", "Generated tokens", ["model_name"], registry=r
        )
        self.finished = Counter(
            PREFIX + "request_success",
            "Finished requests by reason",
            ["model_name", "finished_reason"],
            registry=r,
        )

    def _latency_metrics(self, r: CollectorRegistry) -> None:
        """Histograms: time to first token, between tokens and to the end; tokens per forward; batch size."""
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Arrival to first token",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Gap between deliveries divided by the tokens delivered, once per token",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Arrival to finish",
            ["model_name"],
            buckets=_LATENCY,
            registry=r,
        )
        self.tokens_per_forward = Histogram(
            PREFIX + "tokens_per_forward",
            "Tokens a request commits per target forward (accepted + 1)",
            ["model_name"],
            buckets=_TOKENS,
            registry=r,
        )
        self.batch_size = Histogram(
            PREFIX + "batch_size",
            "Requests verified per batched target forward",
            ["model_name"],
            buckets=_TOKENS,
            registry=r,
        )

    # -- updates (called from the engine thread) --------------------------------------------

    def observe_step(
        self,
        task: str,
        drafter: str | Spec,
        drafted: int,
        accepted: int,
        committed: int,
        depth: int | None = None,
    ) -> None:
        """depth: the draft positions checked (a tree's depth; None: a chain, = drafted)."""
        labels = (self.model_name, task, self.drafter_label(drafter))
        self.steps.labels(*labels).inc()
        if drafted:
            self.drafts.labels(*labels).inc()
            self.draft_tokens.labels(*labels).inc(drafted)
            self.accepted.labels(*labels).inc(accepted)
            for pos in range(drafted if depth is None else depth):
                self.drafted_per_pos.labels(*labels, str(pos)).inc()
            for pos in range(accepted):
                self.accepted_per_pos.labels(*labels, str(pos)).inc()
        self.tokens_per_forward.labels(self.model_name).observe(accepted + 1)
        self.generation_tokens.labels(self.model_name).inc(committed)

    def observe_prefix(self, queries: int, hits: int) -> None:
        """Blocks looked up and found since the last call."""
        self.prefix_queries.labels(self.model_name).inc(queries)
        self.prefix_hits.labels(self.model_name).inc(hits)

    def observe_delivery(self, gap_s: float, tokens: int, first: bool) -> None:
        if first:
            self.ttft.labels(self.model_name).observe(gap_s)
        elif tokens:
            for _ in range(tokens):
                self.itl.labels(self.model_name).observe(gap_s / tokens)

    def observe_finish(self, reason: str, e2e_s: float) -> None:
        self.finished.labels(self.model_name, reason).inc()
        self.e2e.labels(self.model_name).observe(e2e_s)

    def set_queue(self, running: int, waiting: int) -> None:
        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)

    def set_cache(self, usage: float, backed_bytes: int) -> None:
        self.cache_usage.labels(self.model_name).set(usage)
        self.cache_backed.labels(self.model_name).set(backed_bytes)

    # -- views --------------------------------------------------------------------------------

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)

    def stats(self) -> dict:
        """JSON view of the same counters: totals, per task and per drafter."""
        total, by_task, by_drafter = _Tally(), defaultdict(_Tally), defaultdict(_Tally)
        for metric in self.registry.collect():
            name = metric.name.removeprefix(PREFIX + "spec_decode_")
            if not metric.name.startswith(PREFIX + "spec_decode_"):
                continue
            for s in metric.samples:
                if not s.name.endswith("_total"):
                    continue
                for tally in (total, by_task[s.labels["task"]], by_drafter[s.labels["drafter"]]):
                    tally.add(name, s.labels.get("position"), s.value)
        return {
            "model": self.model_name,
            "spec_decode": total.to_json(),
            "per_task": {t: v.to_json() for t, v in sorted(by_task.items())},
            "per_drafter": {d: v.to_json() for d, v in sorted(by_drafter.items())},
            "requests": {
                "running": _gauge(self.running, self.model_name),
                "waiting": _gauge(self.waiting, self.model_name),
            },
        }


def _gauge(gauge: Gauge, model_name: str) -> int:
    return int(gauge.labels(model_name)._value.get())


class _Tally:
    def __init__(self):
        self.values = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
        self.per_pos: dict[int, int] = {}

    def add(self, name: str, position: str | None, value: float) -> None:
        if name == "num_accepted_tokens_per_pos":
            self.per_pos[int(position)] = self.per_pos.get(int(position), 0) + int(value)
        elif name in self.values:
            self.values[name] += int(value)

    def to_json(self) -> dict:
        v = self.values
        drafts, drafted, accepted = v["num_drafts"], v["num_draft_tokens"], v["num_accepted_tokens"]
        size = max(self.per_pos, default=-1) + 1
        alpha, tau = (
            metrics.acceptance_rate(accepted, drafted),
            metrics.mean_acceptance_length(accepted, drafts),
        )
        return {
            **v,
            "acceptance_rate": None if alpha is None else round(alpha, 4),
            "mean_acceptance_length": None if tau is None else round(tau, 4),
            "num_accepted_tokens_per_pos": [self.per_pos.get(i, 0) for i in range(size)],
        }

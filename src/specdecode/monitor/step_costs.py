"""A server's own step times from its /metrics, the input of decoding/step_fit.py.

vLLM observes `vllm:inter_token_latency_seconds` once per decoding step and request (the time since
that request's previous output), so its _sum / _count is the mean step time requests saw, and its
speculation counters give the tokens drafted per step (num_draft_tokens / num_drafts). Both read
from one scrape (totals since the server started) or as the increase between two scrapes of the
same server (one measurement). Our server observes its histogram per token, not per step, so its
step times come from `specdecode bench`, not from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.decoding.step_fit import StepTiming
from specdecode.errors import UserError
from specdecode.monitor import prom
from specdecode.monitor.tracker import Counts, group_counts, spec_series

LATENCY = "vllm:inter_token_latency_seconds"


@dataclass(frozen=True)
class Reading:
    counts: Counts  # speculation counters (zero without speculation)
    latency_s: float  # Σ inter-token latencies
    latency_n: float  # their count: steps x requests


def reading(samples: list[prom.Sample]) -> Reading:
    """One scrape's samples -> the counters step times need (summed over engines and models)."""
    total_s = sum(s.value for s in samples if s.name == LATENCY + "_sum")
    total_n = sum(s.value for s in samples if s.name == LATENCY + "_count")
    return Reading(group_counts(spec_series(samples)[1], None)["all"], total_s, total_n)


def timing(after: Reading, before: Reading | None = None, source: str = "the scrape") -> StepTiming:
    """The steps between two readings of one server (or since it started) -> mean step time and
    tokens drafted per step."""
    before = before or Reading(Counts(), 0.0, 0.0)
    n = after.latency_n - before.latency_n
    if n <= 0:
        raise UserError(
            f"{source} has no decoding steps in {LATENCY}: is it vLLM, and has it served requests?"
        )
    drafts = after.counts.drafts - before.counts.drafts
    drafted = after.counts.draft_tokens - before.counts.draft_tokens
    return StepTiming(drafted / drafts if drafts > 0 else 0.0, (after.latency_s - before.latency_s) / n, n)


def read(source: str) -> StepTiming:
    """A vLLM /metrics URL or saved scrape -> its step timing since the server started."""
    try:
        samples = prom.parse(prom.fetch(source))
    except ValueError as e:
        raise UserError(f"{source} is not Prometheus text: {e}") from None
    return timing(reading(samples), source=source)

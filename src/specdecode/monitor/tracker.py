"""Speculation counters over successive scrapes: totals, sliding windows of deltas, drift.

Reads vLLM's `vllm:spec_decode_*` counters and our server's `specdecode:spec_decode_*` (same names
and meaning, engine/metrics.py), with or without the `_total` suffix. Definitions, as vLLM's
SpecDecodingLogging and our metrics.py:

    α (acceptance rate)          = accepted tokens / draft tokens
    τ (mean acceptance length)   = 1 + accepted tokens / drafts      (the bonus token included)
    acceptance at position i     = accepted_per_pos[i] / drafts      (0-based i)

A draft is one verify step that carried draft tokens; the formulas are specdecode.core.metrics', the
ones the CLI, bench and server report.

Where the per-position figure is biased: it divides by all drafts, so it is P(a draft reached
position i and i was accepted). With drafts of fixed length k (eagle3, medusa, draft_model) that is
the acceptance at i; with variable-length drafts (suffix, ngram: a match may offer fewer than k
tokens, or the spec factor shortens it) drafts too short to reach i count as rejections at i, so
it understates acceptance there (mean_draft_length = draft_tokens / drafts < k shows it happens).
The product is still what the expected tokens per step need (a token never drafted is never
accepted), so speedup estimates from it are right in their numerator; what is lost is the split
into supply and acceptance. Our server also exports num_drafted_tokens_per_pos (drafts that reached
i); with it, acceptance_by_drafted_position = accepted_per_pos[i] / drafted_per_pos[i] and the
supply profile are exact. vLLM exports no such counter: its per-request `detailed` spec-decode
metrics (per-step drafted/accepted arrays) give the same split for the requests one reads.

Windows: each scrape contributes the counters' increase since the previous scrape, per series
(one label set); a series that went down was reset (the server restarted), so its new value is the
increase. The window sums the increases of the scrapes within the last `window_s` seconds.
Drift: the baseline α is the first full window's (or given); an alert is raised while the windowed
α is below it by the drift fraction of the adaptive controller (taskstate.drifted).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from specdecode.core import metrics
from specdecode.decoding.taskstate import DRIFT_DROP, drifted

PREFIXES = ("vllm:", "specdecode:")  # vLLM's and ours; the first one present is read
FAMILIES = (
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_accepted_tokens_per_pos",
    "num_drafted_tokens_per_pos",  # ours only
)
ALL = "all"

log = logging.getLogger("specdecode.drift")

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (family, labels)


@dataclass
class Counts:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = field(default_factory=dict)
    drafted_pos: dict[int, float] = field(default_factory=dict)  # drafts that reached i (ours only)

    def add(self, family: str, labels: dict[str, str], value: float) -> None:
        if family in ("num_accepted_tokens_per_pos", "num_drafted_tokens_per_pos"):
            pos = int(labels.get("position", 0))
            into = self.per_pos if family == "num_accepted_tokens_per_pos" else self.drafted_pos
            into[pos] = into.get(pos, 0.0) + value
        else:
            name = {
                "num_drafts": "drafts",
                "num_draft_tokens": "draft_tokens",
                "num_accepted_tokens": "accepted",
            }[family]
            setattr(self, name, getattr(self, name) + value)

    def __add__(self, other: "Counts") -> "Counts":
        def merged(a: dict, b: dict) -> dict:
            return {pos: a.get(pos, 0.0) + b.get(pos, 0.0) for pos in a.keys() | b.keys()}

        return Counts(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            merged(self.per_pos, other.per_pos),
            merged(self.drafted_pos, other.drafted_pos),
        )

    @property
    def alpha(self) -> float | None:
        return metrics.acceptance_rate(self.accepted, self.draft_tokens)

    @property
    def tau(self) -> float | None:
        return metrics.mean_acceptance_length(self.accepted, self.drafts)

    @property
    def by_position(self) -> list[float]:
        size = max(self.per_pos, default=-1) + 1
        return metrics.acceptance_by_position([self.per_pos.get(i, 0.0) for i in range(size)], self.drafts)

    @property
    def mean_draft_length(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts else None

    @property
    def by_drafted_position(self) -> list[float | None] | None:
        """accepted at i / drafts that reached i; None without the drafted-per-position counter."""
        if not self.drafted_pos:
            return None
        size = max(self.per_pos.keys() | self.drafted_pos.keys()) + 1
        n = [self.drafted_pos.get(i, 0.0) for i in range(size)]
        return [self.per_pos.get(i, 0.0) / d if d else None for i, d in enumerate(n)]

    def to_json(self) -> dict:
        r = lambda x: None if x is None else round(x, 4)  # noqa: E731
        out = {
            "num_drafts": self.drafts,
            "num_draft_tokens": self.draft_tokens,
            "num_accepted_tokens": self.accepted,
            "acceptance_rate": r(self.alpha),
            "mean_acceptance_length": r(self.tau),
            "mean_draft_length": r(self.mean_draft_length),
            "acceptance_by_position": [r(x) for x in self.by_position],
        }
        if self.drafted_pos:
            out["acceptance_by_drafted_position"] = [r(x) for x in self.by_drafted_position]
        return out


def spec_series(samples) -> tuple[str | None, dict[SeriesKey, float]]:
    """Samples of one scrape -> (prefix read, {(family, labels): value}); (None, {}) without any."""
    found: dict[str, dict[SeriesKey, float]] = {}
    for s in samples:
        for prefix in PREFIXES:
            if not s.name.startswith(prefix + "spec_decode_") or s.name.endswith("_created"):
                continue
            family = s.name[len(prefix + "spec_decode_") :].removesuffix("_total")
            if family in FAMILIES:
                found.setdefault(prefix, {}).setdefault((family, s.labels), s.value)
    prefix = next((p for p in PREFIXES if p in found), None)
    return prefix, found.get(prefix, {})


def group_counts(series: dict[SeriesKey, float], by: str | None) -> dict[str, Counts]:
    """{series: value} -> {"all": Counts, and per value of label `by` when given}."""
    groups: dict[str, Counts] = {ALL: Counts()}
    for (family, labels), value in series.items():
        labels = dict(labels)
        groups[ALL].add(family, labels, value)
        if by:
            groups.setdefault(labels.get(by, ""), Counts()).add(family, labels, value)
    return groups


@dataclass
class GroupView:
    total: Counts
    window: Counts | None  # None until a second scrape
    baseline_alpha: float | None
    drift_alert: bool


@dataclass
class Snapshot:
    time: float
    prefix: str | None
    window_s: float  # span the window covers (previous scrape of its oldest entry .. now)
    scrapes: int  # scrape intervals in the window
    resets: int  # scrapes so far in which some counter went down
    groups: dict[str, GroupView]


@dataclass
class _Group:
    entries: deque = field(default_factory=deque)  # (t_prev, t, Counts of increases)
    baseline: float | None = None
    alert: bool = False


class Tracker:
    def __init__(
        self,
        window_s: float = 60.0,
        drift_drop: float = DRIFT_DROP,
        baseline_alpha: float | None = None,
        min_draft_tokens: float = 50,
        by: str | None = None,
    ):
        self.window_s, self.drift_drop, self.min_draft_tokens, self.by = (
            window_s,
            drift_drop,
            min_draft_tokens,
            by,
        )
        self.fixed_baseline = baseline_alpha
        self.last: dict[SeriesKey, float] | None = None
        self.started = self.prev_t = None
        self.resets = 0
        self.groups: dict[str, _Group] = {}

    def _increases(self, series: dict[SeriesKey, float]) -> dict[SeriesKey, float]:
        out, reset = {}, False
        for key, value in series.items():
            old = self.last.get(key)
            if (
                old is None or value < old
            ):  # new series (started at 0), or reset: the new value is the increase
                reset |= old is not None
                out[key] = value
            else:
                out[key] = value - old
        self.resets += reset
        return out

    def update(self, t: float, samples) -> Snapshot:
        prefix, series = spec_series(samples)
        totals = group_counts(series, self.by)
        increases = None if self.last is None else group_counts(self._increases(series), self.by)
        if self.started is None:
            self.started = t
        views = {}
        for name in sorted(
            set(totals) | set(self.groups) | set(increases or {}), key=lambda g: (g != ALL, g)
        ):
            group = self.groups.setdefault(name, _Group(baseline=self.fixed_baseline))
            if increases is not None:
                group.entries.append((self.prev_t, t, increases.get(name, Counts())))
                while len(group.entries) > 1 and group.entries[0][0] < t - self.window_s - 1e-9:
                    group.entries.popleft()
            views[name] = self._judge(name, group, t, totals.get(name, Counts()))
        span = t - self.groups[ALL].entries[0][0] if self.groups[ALL].entries else 0.0
        snapshot = Snapshot(t, prefix, span, len(self.groups[ALL].entries), self.resets, views)
        self.last, self.prev_t = series, t
        return snapshot

    def _judge(self, name: str, group: _Group, t: float, total: Counts) -> GroupView:
        if not group.entries:
            return GroupView(total, None, group.baseline, False)
        window = sum((c for _, _, c in group.entries), Counts())
        enough = window.draft_tokens >= self.min_draft_tokens
        if group.baseline is None and enough and t - self.started >= self.window_s - 1e-9:
            group.baseline = window.alpha
        alert = bool(
            enough and group.baseline is not None and drifted(window.alpha, group.baseline, self.drift_drop)
        )
        if alert and not group.alert:
            log.warning(
                "acceptance drift (%s): α %.3f over the last %.0f s, baseline %.3f",
                name,
                window.alpha,
                self.window_s,
                group.baseline,
            )
        group.alert = alert
        return GroupView(total, window, group.baseline, alert)

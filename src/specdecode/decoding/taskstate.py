"""Per-task acceptance history: α, τ and realised speedup per (task, drafter), as EWMAs with
counts, a per-position acceptance profile that seeds adaptive k, and a drift alarm. Persisted
as a small JSON file (written atomically) so the history survives restarts.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdecode.errors import UserError
from specdecode.files import write_atomic

log = logging.getLogger("specdecode.drift")

DRIFT_DROP = 0.25  # alarm when recent α falls this fraction below its baseline


def drifted(recent_alpha: float, baseline_alpha: float, drop: float = DRIFT_DROP) -> bool:
    """The drift rule, defined once: recent α below baseline × (1 − drop). Used per task here and
    over sliding windows of scraped counters by `specdecode monitor`."""
    return recent_alpha < baseline_alpha * (1 - drop)


@dataclass
class TaskRecord:
    requests: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    alpha: float | None = None  # EWMA over requests
    tau: float | None = None
    speedup: float | None = None
    profile: list[float] = field(default_factory=list)  # conditional acceptance per position (EWMA)
    baseline_alpha: float | None = None  # mean α of the first `baseline_n` requests
    recent: list[float] = field(default_factory=list)  # α of the last `window` requests
    drift_alerts: int = 0


def _ewma(old: float | None, new: float, w: float) -> float:
    return new if old is None else (1 - w) * old + w * new


class TaskState:
    """Keyed by "task|drafter". `observe` after each request; `save` persists."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        weight: float = 0.2,
        window: int = 20,
        baseline_n: int = 20,
        drift_drop: float = DRIFT_DROP,
    ):
        self.path = Path(path) if path else None
        self.weight, self.window, self.baseline_n, self.drift_drop = weight, window, baseline_n, drift_drop
        self.records: dict[str, TaskRecord] = {}
        if self.path and self.path.exists():
            try:
                raw = json.loads(self.path.read_text())
                self.records = {key: TaskRecord(**rec) for key, rec in raw["records"].items()}
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise UserError(f"state file {self.path} is not a specdecode state file ({e})") from None

    def get(self, task: str, drafter: str) -> TaskRecord | None:
        return self.records.get(f"{task}|{drafter}")

    def observe(self, task: str, drafter: str, stats, speedup: float | None = None) -> bool:
        """Record one request's Stats; returns True when this request raised a drift alert."""
        rec = self.records.setdefault(f"{task}|{drafter}", TaskRecord())
        rec.requests += 1
        rec.drafted += stats.drafted
        rec.accepted += stats.accepted
        rec.steps += stats.steps
        if speedup is not None:
            rec.speedup = _ewma(rec.speedup, speedup, self.weight)
        if stats.drafted == 0:
            return False
        alpha = stats.acceptance_rate
        rec.alpha = _ewma(rec.alpha, alpha, self.weight)
        rec.tau = _ewma(rec.tau, stats.mean_accepted_length, self.weight)
        conditional = stats.conditional_acceptance
        size = max(len(rec.profile), len(conditional))
        rec.profile = [
            _ewma(rec.profile[i] if i < len(rec.profile) else None, conditional[i], self.weight)
            if i < len(conditional)
            else rec.profile[i]
            for i in range(size)
        ]
        rec.recent = (rec.recent + [alpha])[-self.window :]
        if rec.baseline_alpha is None and len(rec.recent) >= min(self.baseline_n, self.window):
            rec.baseline_alpha = sum(rec.recent) / len(rec.recent)
        elif rec.baseline_alpha is not None and len(rec.recent) == self.window:
            mean = sum(rec.recent) / len(rec.recent)
            if drifted(mean, rec.baseline_alpha, self.drift_drop):
                rec.drift_alerts += 1
                log.warning(
                    "acceptance drift on task %r with drafter %r: α %.3f over the last %d requests, "
                    "baseline %.3f",
                    task,
                    drafter,
                    mean,
                    self.window,
                    rec.baseline_alpha,
                )
                rec.recent = []  # re-arm after a full new window
                return True
        return False

    def save(self) -> None:
        if not self.path:
            return
        data = json.dumps(
            {"version": 1, "records": {k: asdict(v) for k, v in self.records.items()}}, indent=1
        )
        write_atomic(self.path, lambda tmp: Path(tmp).write_text(data))

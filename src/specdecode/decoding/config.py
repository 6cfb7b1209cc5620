"""The speculation config file written by `specdecode advise` and read by generate/serve --config.

{
  "version": 1,
  "default": {"drafter": "ngram", "k": 4, "adaptive": true},
  "routing": {"code": {"drafter": "ngram", "k": 6}, "creative": {"drafter": "none"}},
  "candidates": ["none", "ngram"],          # drafters --routing auto may choose from
  "costs": {"ngram": {"draft_cost": 0.001, "verify_ratio": {"1": 1.05, ...}, "step_s": 0.04}},
  "target": null, "dtype": "fp32",          # informational: what the advice was measured on
  "k_by_batch_size": [[1, 4, 4], [5, 16, 2], [17, 256, 1]]   # optional: k per batch-size range
}

k_by_batch_size (written by `advise --from-metrics`) is the default route's k per inclusive range of
concurrent sequences, from the measured costs: `export vllm` writes it as vLLM's
num_speculative_tokens_per_batch_size; `serve` caps each batch's k with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specdecode.backends.precision import FP32, Precision
from specdecode.core.tasks import TASKS
from specdecode.decoding.control import CostModel
from specdecode.decoding.generation import MAX_K
from specdecode.drafters import Spec, parse
from specdecode.errors import UserError


@dataclass(frozen=True)
class Route:
    """A drafter (parsed where it entered: a config file, a command line, a request) and its k."""

    drafter: Spec = field(default_factory=lambda: parse("ngram"))
    k: int = 4  # fixed k, or the largest k adaptive control may pick
    adaptive: bool = True

    def to_json(self) -> dict:
        return {"drafter": str(self.drafter), "k": self.k, "adaptive": self.adaptive}


@dataclass
class SpecConfig:
    default: Route = field(default_factory=Route)
    routing: dict[str, Route] = field(default_factory=dict)
    candidates: list[Spec] = field(default_factory=lambda: [parse("none"), parse("ngram")])
    costs: dict[Spec, CostModel] = field(default_factory=dict)
    target: str | None = None
    precision: Precision = FP32  # informational: what the advice was measured on
    k_by_batch_size: list[tuple[int, int, int]] | None = None  # (first, last, k), inclusive ranges

    def k_for_batch(self, size: int, k: int) -> int:
        """k capped by the schedule's entry for `size` concurrent sequences (the last range beyond)."""
        if not self.k_by_batch_size:
            return k
        for _, hi, cap in self.k_by_batch_size:
            if size <= hi:
                return min(k, cap)
        return min(k, self.k_by_batch_size[-1][2])

    def route(self, task: str) -> Route:
        return self.routing.get(task, self.default)

    def to_json(self) -> dict:
        return {
            "version": 1,
            "default": self.default.to_json(),
            "routing": {t: r.to_json() for t, r in self.routing.items()},
            "candidates": [str(c) for c in self.candidates],
            "costs": {str(d): c.to_json() for d, c in self.costs.items()},
            "target": self.target,
            "dtype": str(self.precision),
            **({"k_by_batch_size": [list(r) for r in self.k_by_batch_size]} if self.k_by_batch_size else {}),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _route(obj, where: str) -> Route:
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected an object with 'drafter', 'k', 'adaptive'")
    unknown = set(obj) - {"drafter", "k", "adaptive"}
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    drafter = obj.get("drafter", "ngram")
    k = obj.get("k", 4)
    adaptive = obj.get("adaptive", True)
    if not isinstance(drafter, str):
        raise UserError(f"{where}.drafter: expected a string")
    drafter = parse(drafter)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise UserError(f"{where}.k: expected an integer between 1 and {MAX_K}, got {k!r}")
    if not isinstance(adaptive, bool):
        raise UserError(f"{where}.adaptive: expected true or false")
    return Route(drafter, k, adaptive)


def check_schedule(obj, where: str) -> list[tuple[int, int, int]]:
    """[[first, last, k], ...] -> sorted tuples; the ranges must start at 1, not overlap, k in 0..MAX_K."""
    if not isinstance(obj, list) or not obj:
        raise UserError(f"{where}: expected a non-empty list of [first, last, k]")
    rows = []
    for row in obj:
        if (
            not isinstance(row, list | tuple)
            or len(row) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in row)
        ):
            raise UserError(f"{where}: each entry must be [first, last, k] integers, got {row!r}")
        lo, hi, k = row
        if not 1 <= lo <= hi or not 0 <= k <= MAX_K:
            raise UserError(f"{where}: bad entry {row!r} (need 1 <= first <= last and 0 <= k <= {MAX_K})")
        rows.append((lo, hi, k))
    rows.sort()
    if rows[0][0] != 1 or any(b[0] <= a[1] for a, b in zip(rows, rows[1:])):
        raise UserError(f"{where}: ranges must start at batch size 1 and not overlap")
    return rows


def _precision(text, path: Path) -> Precision:
    try:
        return Precision.parse(text)
    except UserError as e:
        raise UserError(f"config {path}: {e}") from None


def load_config(path: str | Path) -> SpecConfig:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"config {path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(raw, dict) or raw.get("version") != 1:
        raise UserError(f'config {path}: expected a JSON object with "version": 1')
    routing = raw.get("routing", {})
    if not isinstance(routing, dict):
        raise UserError(f"config {path}: 'routing' must map task labels to routes")
    bad = set(routing) - set(TASKS)
    if bad:
        raise UserError(
            f"config {path}: unknown task label(s) {', '.join(sorted(bad))}; known: {', '.join(TASKS)}"
        )
    candidates = raw.get("candidates", ["none", "ngram"])
    if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
        raise UserError(f"config {path}: 'candidates' must be a list of drafter names")
    candidates = [parse(c) for c in candidates]
    costs_raw = raw.get("costs", {})
    if not isinstance(costs_raw, dict):
        raise UserError(f"config {path}: 'costs' must map drafters to cost models")
    try:
        costs = {parse(d): CostModel.from_json(c) for d, c in costs_raw.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"config {path}: malformed 'costs' ({e})") from None
    return SpecConfig(
        default=_route(raw.get("default", {}), "default"),
        routing={t: _route(r, f"routing.{t}") for t, r in routing.items()},
        candidates=candidates,
        costs=costs,
        target=raw.get("target"),
        precision=_precision(raw.get("dtype", "fp32"), path),
        k_by_batch_size=(
            check_schedule(raw["k_by_batch_size"], f"config {path}: k_by_batch_size")
            if raw.get("k_by_batch_size") is not None
            else None
        ),
    )

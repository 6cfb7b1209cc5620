"""`specdecode bench`: every drafter and plain decoding on the same prompts, in one process.

Per prompt the drafters run back to back (order rotated per prompt and repeat), so slow phases of a
shared machine hit them alike. Each run's outside CPU load is measured (busy time in /proc/stat
minus this process's own CPU time); a run taken under load is repeated once. Speedups are ratios
of total tokens per second measured in this run.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

from specdecode import drafters as drafter_registry
from specdecode import models
from specdecode.corpora import Prompt
from specdecode.generation import Result, generate
from specdecode.metrics import Stats
from specdecode.sampling import SamplingParams

LOAD_LIMIT = 0.3  # cores busy with other work during a run before it is repeated


def _busy_jiffies() -> int | None:
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle


def measured(fn):
    """Run fn() -> (result, outside_load_in_cores or None)."""
    hz = os.sysconf("SC_CLK_TCK")
    busy0, cpu0, t0 = _busy_jiffies(), time.process_time(), time.perf_counter()
    result = fn()
    busy1, cpu1, t1 = _busy_jiffies(), time.process_time(), time.perf_counter()
    if busy0 is None or t1 - t0 <= 0:
        return result, None
    outside = ((busy1 - busy0) / hz - (cpu1 - cpu0)) / (t1 - t0)
    return result, max(0.0, outside)


@dataclass
class Cell:
    """All runs of one (dtype, drafter) over the prompt set."""

    results: dict[str, Result] = field(default_factory=dict)  # prompt id -> result of the first repeat
    walls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    reruns: int = 0


def variants(drafter_specs: list[str], ks: list[int], adaptive: bool) -> list[tuple[str, str, int | None]]:
    """(label, drafter spec, fixed k or None for adaptive k) for every run of a prompt; plain first."""
    out: list[tuple[str, str, int | None]] = [("none", "none", 1)]
    for s in dict.fromkeys(d for d in drafter_specs if d != "none"):
        out += [(s if len(ks) == 1 else f"{s}@k{k}", s, k) for k in ks]
        if adaptive:
            out.append((f"{s}+adaptive", s, None))
    return out


def run(
    prompts: list[Prompt],
    drafter_specs: list[str],
    *,
    target: str | None,
    dtypes: list[str],
    device: str | None,
    backend: str = "auto",
    target_quant: str = "none",
    drafter_quant: str = "none",
    ks: list[int],
    k_max: int = 12,
    params: SamplingParams,
    max_new_tokens: int,
    repeats: int = 1,
    seed: int = 0,
    adaptive: bool = False,
    log=print,
) -> dict:
    """ks: the fixed k values to run each drafter with. adaptive: also run every drafter with
    adaptive k (0..k_max), labelled `<drafter>+adaptive`, with its cost model measured once and
    per-category acceptance history carried across prompts."""
    runs = variants(drafter_specs, ks, adaptive)
    labels = [label for label, _, _ in runs]
    cells: dict[tuple[str, str], Cell] = {}
    for dtype in dtypes:
        loaded = models.load(target, dtype, device, backend, target_quant)
        ctx = drafter_registry.DrafterContext(loaded, dtype, device, backend, drafter_quant)
        built = {spec: drafter_registry.build(spec, ctx) for _, spec, _ in runs}
        adaptive_specs = [spec for _, spec, k in runs if k is None]
        policy = _policies(loaded, built, adaptive_specs, k_max, prompts[0].prompt, params)
        for _, spec, k in runs:  # warm-up, excluded
            generate(loaded, built[spec], prompts[0].prompt, k=k or k_max, params=params, max_new_tokens=8, seed=seed)
        for r in range(repeats):
            for i, p in enumerate(prompts):
                shift = (i + r) % len(runs)
                for label, spec, k in runs[shift:] + runs[:shift]:
                    cell = cells.setdefault((dtype, label), Cell())
                    go = lambda: generate(loaded, built[spec], p.prompt,  # noqa: E731
                                          k=k if k is not None else policy[spec](p.category), params=params,
                                          max_new_tokens=max_new_tokens, seed=seed)
                    res, load = measured(go)
                    if load is not None and load > LOAD_LIMIT:
                        cell.reruns += 1
                        res, load = measured(go)
                    if k is None:
                        policy[spec].state.observe(p.category, label, res.stats)
                    cell.walls[p.id].append(res.stats.wall_s)
                    res.id, res.category = p.id, p.category
                    cell.results.setdefault(p.id, res)
            log(f"[{dtype}] repeat {r + 1}/{repeats} done")
    return report(prompts, cells, dtypes, labels)


class _AdaptiveFactory:
    """A fresh AdaptiveK per request, seeded with the category's acceptance history."""

    def __init__(self, cost, k_max, label):
        from specdecode.taskstate import TaskState

        self.cost, self.k_max, self.label, self.state = cost, k_max, label, TaskState()

    def __call__(self, category: str):
        from specdecode.control import AdaptiveK
        from specdecode.costs import CostTracker

        rec = self.state.get(category, self.label)
        prior = rec.profile if rec and rec.profile else [0.5]
        return AdaptiveK(self.cost, self.k_max, prior=prior, tracker=CostTracker(self.cost))


def _policies(loaded, built, specs, k_max, probe_prompt, params) -> dict:
    """drafter spec -> _AdaptiveFactory with the drafter's measured cost model."""
    from specdecode.costs import measure
    from specdecode.generation import encode_prompt

    ids = encode_prompt(loaded.tokenizer, probe_prompt, None)
    return {s: _AdaptiveFactory(measure(loaded.model, built[s], k_max, ids, params), k_max, f"{s}+adaptive")
            for s in specs}


def report(prompts: list[Prompt], cells: dict, dtypes: list[str], specs: list[str]) -> dict:
    categories = sorted({p.category for p in prompts}) + ["ALL"]
    rows = []
    for dtype in dtypes:
        base = cells[(dtype, "none")]
        for s in specs:
            cell = cells[(dtype, s)]
            for cat in categories:
                ids = [p.id for p in prompts if cat == "ALL" or p.category == cat]
                stats = Stats()
                for pid in ids:
                    stats = stats.merge(cell.results[pid].stats)
                tokens = sum(len(cell.results[pid].token_ids) for pid in ids)
                wall = sum(statistics.median(cell.walls[pid]) for pid in ids)
                base_tokens = sum(len(base.results[pid].token_ids) for pid in ids)
                base_wall = sum(statistics.median(base.walls[pid]) for pid in ids)
                same = sum(cell.results[pid].token_ids == base.results[pid].token_ids for pid in ids)
                tps = tokens / wall if wall else 0.0
                rows.append({
                    "dtype": dtype, "drafter": s, "category": cat, "prompts": len(ids),
                    "acceptance_rate": round(stats.acceptance_rate, 4),
                    "mean_accepted_length": round(stats.mean_accepted_length, 4),
                    "acceptance_by_position": [round(x, 3) for x in stats.acceptance_by_position],
                    "tokens_per_s": round(tps, 2),
                    "speedup_vs_none": round(tps / (base_tokens / base_wall), 3) if base_wall else None,
                    "identical_to_none": round(same / len(ids), 3),
                    "reruns_under_load": cell.reruns if cat == "ALL" else None,
                })
    best_plain = max(r["tokens_per_s"] for r in rows if r["drafter"] == "none" and r["category"] == "ALL")
    for r in rows:
        if r["category"] == "ALL":
            r["speedup_vs_best_plain"] = round(r["tokens_per_s"] / best_plain, 3)
    return {"rows": rows, "best_plain_tokens_per_s": best_plain}


def table(report_: dict) -> str:
    head = "| dtype | drafter | category | α | τ | tok/s | speedup vs none | identical to none |"
    lines = [head, "|" + "---|" * 8]
    for r in report_["rows"]:
        lines.append(
            f"| {r['dtype']} | {r['drafter']} | {r['category']} | {r['acceptance_rate']:.3f} | "
            f"{r['mean_accepted_length']:.2f} | {r['tokens_per_s']:.1f} | {r['speedup_vs_none']:.2f}× | "
            f"{r['identical_to_none'] * 100:.0f}% |"
        )
    overall = [r for r in report_["rows"] if r["category"] == "ALL"]
    lines.append("")
    lines.append(f"fastest plain decoding: {report_['best_plain_tokens_per_s']:.1f} tok/s")
    for r in overall:
        lines.append(f"{r['dtype']} {r['drafter']}: {r['speedup_vs_best_plain']:.2f}× vs fastest plain "
                     f"(identical to none in its dtype: {r['identical_to_none'] * 100:.0f}%)")
    return "\n".join(lines)


def dump(report_: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report_, f, indent=1)

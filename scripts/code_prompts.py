"""Code-completion prompts for drafter data, written from the installed Python code's own functions.

    python3 scripts/code_prompts.py --out data/code_prompts/functions.jsonl [--count 3000]

The 1.5B's drafter data was 89% answers to chat prompts and 1.2% to code (HumanEval's 164 problems),
so its head saw little code. HumanEval's prompts are a function's signature and docstring with the
body left out; the standard library and the installed packages (numpy, torch, transformers, ...) have
thousands of public functions and methods documented that way. Each prompt here is one of them in
HumanEval's form ("Complete the following Python function." and the signature and docstring in a
fenced block; a method inside its `class` line): the model writes the body in its own words, which is
what a head must learn to draft. Taken: public top-level functions and public methods of public
top-level classes, docstrings of 2 to 30 ASCII lines, at most --per-file from a file and
--per-package from a top-level package, test directories skipped; shuffled with a fixed seed; a
signature and docstring seen twice is kept once.
Writes JSONL ({"prompt", "id", "category": "code"}), the form `train data --prompts` reads.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import random
import sys
import sysconfig
from pathlib import Path

HEAD = "Complete the following Python function.\n```python\n\n"
# not walked: tests, and (under the stdlib root) the packages, which purelib walks as their own root
SKIP = {
    "test",
    "tests",
    "testing",
    "idlelib",
    "lib2to3",
    "_vendor",
    "__pycache__",
    "site-packages",
    "dist-packages",
}


def prompt_for(fn: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None = None) -> str | None:
    """HumanEval's form of `fn` (a method: inside `class cls:`): signature and docstring, no body;
    None where the name is private or the docstring unusable."""
    doc = ast.get_docstring(fn, clean=True)
    if not doc or fn.name.startswith("_") or not 2 <= len(doc.splitlines()) <= 30 or not doc.isascii():
        return None
    pad = "        " if cls else "    "
    lines = doc.replace('"""', "'''").splitlines()
    body = "\n".join(pad + line if line else "" for line in lines)
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    kind = "async def" if isinstance(fn, ast.AsyncFunctionDef) else "def"
    code = f'{kind} {fn.name}({ast.unparse(fn.args)}){returns}:\n{pad}"""\n{body}\n{pad}"""'
    if cls:
        code = f"class {cls}:\n    {code}"
    return f"{HEAD}{code}\n```"


def functions(root: Path, per_file: int):
    """(dotted name, prompt) for the documented public functions and methods under root."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP.intersection(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
            continue
        module = ".".join(rel.with_suffix("").parts)
        found = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.name, prompt_for(node)))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.append((f"{node.name}.{item.name}", prompt_for(item, node.name)))
        for name, text in [f for f in found if f[1]][:per_file]:
            yield f"{module}.{name}", text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--count", type=int, default=0, help="at most this many prompts (0: all)")
    p.add_argument("--per-file", type=int, default=8, help="at most this many from one file")
    p.add_argument(
        "--per-package", type=int, default=150, help="at most this many from one top-level package"
    )
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    paths = sysconfig.get_paths()
    roots = [Path(paths["stdlib"]), Path(paths["purelib"])]
    seen, rows = set(), []
    for root in roots:
        for name, text in functions(root, a.per_file):
            if text not in seen:
                seen.add(text)
                rows.append({"prompt": text, "id": f"pyfn-{name}", "category": "code"})
    random.Random(a.seed).shuffle(rows)
    per, kept = collections.Counter(), []
    for row in rows:  # a package's share capped, so that the largest do not make the set
        per[top := row["id"].split(".")[0]] += 1
        if per[top] <= a.per_package:
            kept.append(row)
    rows = kept[: a.count or None]
    if not rows:
        print(f"no documented public functions under {', '.join(map(str, roots))}", file=sys.stderr)
        return 1
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} prompts from {', '.join(map(str, roots))} -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

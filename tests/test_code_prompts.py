"""scripts/code_prompts.py: documented public functions and methods become HumanEval-form prompts."""

import ast
import json

import pytest

from helpers import load_script

SOURCE = '''
def area(w: float, h: float = 1.0) -> float:
    """Area of a rectangle.

    >>> area(2, 3)
    6
    """
    return w * h


def _private(x):
    """Hidden.

    Not a prompt.
    """


def one_line(x):
    """Too short to say what to write."""


class Shape:
    def scale(self, k):
        """Scale the shape by k.

        Returns a new shape.
        """
        return self

    def _hidden(self):
        """Private method.

        Skipped.
        """
'''


@pytest.fixture(scope="module")
def mod():
    return load_script("code_prompts")


def test_prompts_keep_signature_and_docstring_not_body(mod, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "geo.py").write_text(SOURCE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_geo.py").write_text(SOURCE)  # test directories are skipped
    found = dict(mod.functions(tmp_path, per_file=8))
    assert sorted(found) == ["pkg.geo.Shape.scale", "pkg.geo.area"]
    text = found["pkg.geo.area"]
    assert text.startswith(
        "Complete the following Python function.\n```python\n\ndef area(w: float, h: float=1.0) -> float:"
    )
    assert "return w * h" not in text and ">>> area(2, 3)" in text and text.endswith("```")
    code = text.split("```python\n", 1)[1].rsplit("```", 1)[0]
    tree = ast.parse(code)  # a function with only its docstring: valid Python
    assert ast.get_docstring(tree.body[0]).startswith("Area of a rectangle.")
    method = found["pkg.geo.Shape.scale"]
    assert 'class Shape:\n    def scale(self, k):\n        """' in method and "return self" not in method


def test_per_file_cap_and_main_writes_jsonl(mod, tmp_path, monkeypatch):
    root = tmp_path / "lib"
    root.mkdir()
    (root / "a.py").write_text(SOURCE)
    (root / "b.py").write_text(SOURCE.replace("area", "perimeter"))
    assert len(list(mod.functions(root, per_file=1))) == 2
    monkeypatch.setattr(
        mod.sysconfig, "get_paths", lambda: {"stdlib": str(root), "purelib": str(tmp_path / "none")}
    )
    out = tmp_path / "out" / "p.jsonl"
    assert mod.main(["--out", str(out), "--per-package", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # a.py's area and scale, b.py's perimeter (its scale is a.py's, kept once); one a package at most
    assert len(rows) == 2 and len({r["prompt"] for r in rows}) == 2
    assert all(r["category"] == "code" and r["id"].startswith("pyfn-") for r in rows)


def test_nothing_found_is_an_error(mod, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        mod.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path), "purelib": str(tmp_path)}
    )
    assert mod.main(["--out", str(tmp_path / "p.jsonl")]) == 1
    assert "no documented public functions" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()

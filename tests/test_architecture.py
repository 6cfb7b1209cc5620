"""The dependency rules (pyproject.toml, [tool.importlinter]) hold, and break when a forbidden
import is added: the check runs import-linter on a copy of the package with one import injected."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(no_cache=True, no_logo=True))"
)


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over root/src/specdecode with root/pyproject.toml's contracts."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def copy(tmp_path) -> Path:
    """The package (without its shipped weights) and its contracts in a scratch directory."""
    shutil.copytree(
        ROOT / "src" / "specdecode",
        tmp_path / "src" / "specdecode",
        ignore=shutil.ignore_patterns("shipped", "__pycache__", "*.so"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    "module,line,broken",
    [
        (
            "core/verify.py",
            "import specdecode.server.engine",
            [
                "the core and the backends import no wing",
                "verification, sampling and trees import no model code",
            ],
        ),
        (
            "core/tree.py",
            "from specdecode.backends import fast_llama",
            ["verification, sampling and trees import no model code"],
        ),
        (
            "backends/models.py",
            "from specdecode.bench import suite",
            ["the core and the backends import no wing"],
        ),
        ("drafters/eagle.py", "from specdecode.drafters import medusa", ["drafters never import each other"]),
        (
            "monitor/view.py",
            "from specdecode.server import metrics",
            ["the wings are independent of each other"],
        ),
        ("bench/suite.py", "from specdecode.export import vllm", ["the wings are independent of each other"]),
        (
            "drafters/ngram.py",
            "from specdecode.decoding import step",
            ["the core's loop and policy import drafters"],
        ),
        (
            "core/metrics.py",
            "from specdecode.drafters import ngram",
            ["the core's loop and policy import drafters"],
        ),
    ],
)
def test_a_forbidden_import_breaks_its_contract(copy, module, line, broken):
    assert lint(copy).returncode == 0  # the untouched copy passes: the injected line alone breaks it
    path = copy / "src" / "specdecode" / module
    path.write_text(path.read_text() + f"\n{line}  # injected by the test\n")
    result = lint(copy)
    assert result.returncode != 0, result.stdout
    for name in broken:
        assert status(result.stdout, name) == "BROKEN", result.stdout
    assert f"specdecode.{module.removesuffix('.py').replace('/', '.')}" in result.stdout


def status(text: str, name: str) -> str:
    """KEPT or BROKEN, from the summary rows `<name> KEPT|BROKEN` (a long name wraps onto the next line)."""
    summary = text.split("Contracts:")[0].replace("\n", " ")
    return re.search(r"\b(KEPT|BROKEN)\b", summary[summary.index(name) + len(name) :]).group(1)

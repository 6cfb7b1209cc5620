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
    assert int(re.search(r"Contracts: (\d+) kept", result.stdout).group(1)) >= 7, result.stdout


LAYERS = "the layers import downward"
BELOW_WINGS = "nothing below the wings imports a wing"
VERIFY = "verification, sampling and trees import no model code"
POLICIES = "the loop's policies import no model"
WINGS = "the wings are independent of each other"


@pytest.mark.parametrize(
    "module,line,broken",
    [
        ("core/verify.py", "import specdecode.server.app", [BELOW_WINGS, VERIFY, LAYERS]),
        ("engine/loop.py", "from specdecode.server import app", [BELOW_WINGS]),
        ("decoding/step.py", "from specdecode.engine import loop", [LAYERS]),
        ("core/tree.py", "from specdecode.backends import fast_llama", [VERIFY, LAYERS]),
        ("core/sampling.py", "from specdecode.core import plan", [VERIFY]),
        ("core/metrics.py", "from specdecode.drafters import ngram", [LAYERS]),
        ("core/drafter.py", "from specdecode.decoding import control", [LAYERS]),
        ("backends/models.py", "from specdecode.bench import suite", [BELOW_WINGS]),
        ("backends/lm.py", "from specdecode.drafters import spec", [LAYERS]),
        ("drafters/ngram.py", "from specdecode.decoding import step", [LAYERS]),
        ("drafters/eagle.py", "from specdecode.drafters import medusa", ["drafters never import each other"]),
        ("decoding/decoder.py", "from specdecode.api import llm", [BELOW_WINGS]),
        (
            "decoding/batch_decoder.py",
            "from specdecode.decoding import decoder",
            ["the loop for one sequence and the batched loop share step.py"],
        ),
        ("decoding/control.py", "from specdecode.backends import lm", [POLICIES]),
        ("decoding/constraints.py", "from specdecode.decoding import step", [POLICIES]),
        ("monitor/view.py", "from specdecode.server import app", [WINGS]),
        ("bench/suite.py", "from specdecode.export import vllm", [WINGS]),
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

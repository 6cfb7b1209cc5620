"""The tree is formatted and lint-clean by the rules in pyproject.toml ([tool.ruff]): ruff is a test
dependency (the `test` extra), so a missing ruff fails here rather than skipping."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "scripts"]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *PATHS], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("args", [("format", "--check"), ("check",)], ids=["format", "lint"])
def test_ruff_passes(args):
    result = ruff(*args)
    assert result.returncode == 0, result.stdout + result.stderr

"""Precision: parsed once, printed back the same, asked instead of compared."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdecode.backends.precision import AUTO, BF16, FLOATS, FP16, FP32, GGUF, GGUF_EXACT, Precision
from specdecode.errors import UserError

ALL = (FP32, BF16, FP16, GGUF, GGUF_EXACT, AUTO)


def test_parse_round_trips_and_passes_a_value_through():
    for p in ALL:
        assert Precision.parse(str(p)) == p
        assert Precision.parse(p) is p
    assert {str(p) for p in ALL} == {"fp32", "bf16", "fp16", "gguf", "gguf-exact", "auto"}


@pytest.mark.parametrize("bad", ["q4", "FP32", "fp32,gguf", "", "float32"])
def test_a_bad_value_is_named_with_the_choices(bad):
    with pytest.raises(
        UserError, match=rf"unknown dtype {bad!r}; choose one of fp32, bf16, fp16, gguf, gguf-exact or auto"
    ):
        Precision.parse(bad)


def test_facts():
    assert [p for p in ALL if p.quantized] == [GGUF, GGUF_EXACT]
    assert [p for p in ALL if p.int8_activations] == [GGUF]
    assert [p for p in ALL if p.exact] == [FP32, GGUF_EXACT]  # rows with fp32's bits
    assert [p for p in ALL if p.auto] == [AUTO]
    assert [p.torch_dtype for p in ALL[:5]] == [torch.float32, torch.bfloat16, torch.float16] + [
        torch.float32
    ] * 2
    assert [p.weight_bytes for p in ALL] == [4, 2, 2, None, None, None]
    assert FLOATS == (FP32, BF16, FP16)
    with pytest.raises(UserError, match="auto is resolved before a model loads"):
        _ = AUTO.torch_dtype


def test_precision_strings_are_compared_in_one_module():
    """The goal of the type: no other module of src/ compares a precision's name."""
    src = Path(__file__).parents[1] / "src" / "specdecode"
    hits = subprocess.run(
        ["grep", "-rlE", r"[=!]= \"(fp32|bf16|fp16|gguf|gguf-exact)\"|in \(\"(fp32|bf16|gguf)", str(src)],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert [Path(h).relative_to(src).as_posix() for h in hits if h.endswith(".py")] == [
        "backends/precision.py"
    ]


def test_the_command_line_parses_before_torch_loads():
    code = "import sys; from specdecode.backends.precision import GGUF; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

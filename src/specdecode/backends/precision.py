"""Precision, parsed once: the `--dtype` a model loads and computes in.

`fp32`, `bf16`, `fp16`: the weights as float tensors of that torch dtype. `gguf`: a GGUF file's blocks
kept quantized, the linears' input rows quantized to 8 bits; `gguf-exact`: the same blocks with float32
activations, which computes fp32's bits. `auto` picks one of those from the model and the machine
(models.auto_dtype) before anything loads.

`Precision.parse` turns the text into a `Precision` at the edges (CLI arguments, `LLM(dtype=...)`,
config files); `str(p)` gives the canonical text back (metric labels, result files). Code inside asks
the value (`p.quantized`, `p.exact`, `p.torch_dtype`) and never compares a precision's name: this is
the one module that does.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdecode.errors import UserError

_FLOATS = {"fp32": ("float32", 4), "bf16": ("bfloat16", 2), "fp16": ("float16", 2)}  # torch dtype, bytes
_QUANTIZED = ("gguf", "gguf-exact")  # a GGUF file's blocks kept: 8-bit activations, or float32 ones
_AUTO = "auto"


@dataclass(frozen=True)
class Precision:
    name: str  # canonical: one of fp32, bf16, fp16, gguf, gguf-exact, auto

    @classmethod
    def parse(cls, text: str | Precision) -> Precision:
        """A precision from its text (a Precision passes through, for the Python API); a clear error
        naming the bad value and the choices otherwise."""
        if isinstance(text, Precision):
            return text
        if text not in (*_FLOATS, *_QUANTIZED, _AUTO):
            raise UserError(
                f"unknown dtype {text!r}; choose one of {', '.join([*_FLOATS, *_QUANTIZED])} or auto"
            )
        return cls(text)

    def __str__(self) -> str:
        return self.name

    @property
    def auto(self) -> bool:
        """Not chosen yet: models.auto_dtype picks one before anything loads."""
        return self.name == _AUTO

    @property
    def quantized(self) -> bool:
        """A GGUF file's blocks kept quantized (gguf, gguf-exact), not float tensors."""
        return self.name in _QUANTIZED

    @property
    def int8_activations(self) -> bool:
        """The linears quantize their input rows to 8 bits (gguf)."""
        return self.name == "gguf"

    @property
    def exact(self) -> bool:
        """Every row carries fp32's bits (fp32, and gguf-exact's float32 activations over the blocks)."""
        return self.name in ("fp32", "gguf-exact")

    @property
    def torch_dtype(self):
        """The dtype of the weights (fp32, bf16, fp16) or of the activations (gguf, gguf-exact: float32)."""
        if self.auto:
            raise UserError("--dtype auto is resolved before a model loads (models.auto_dtype)")
        import torch  # here, not above: the command line parses a precision before torch loads

        return getattr(torch, _FLOATS[self.name][0] if self.name in _FLOATS else "float32")

    @property
    def weight_bytes(self) -> int | None:
        """Bytes per weight element of a float precision; None for GGUF blocks and auto."""
        return _FLOATS[self.name][1] if self.name in _FLOATS else None


FP32, BF16, FP16 = Precision("fp32"), Precision("bf16"), Precision("fp16")
GGUF, GGUF_EXACT, AUTO = Precision("gguf"), Precision("gguf-exact"), Precision(_AUTO)
FLOATS = (FP32, BF16, FP16)  # weights as float tensors (memory estimates, int8 quantization's start)

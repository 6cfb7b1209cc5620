"""int8 weights through PyTorch's own dynamic quantization (torch.ao.quantization.quantize_dynamic):
every nn.Linear of the decoder layers holds its weight in int8 with one scale per output channel, and
quantizes its input activations per call (fbgemm/x86 kernels, `reduce_range` as torch picks it).
The embedding and the LM head (tied to it in SmolLM2 and Gemma 3) stay in full precision.

CPU only: torch's dynamic int8 kernels have no CUDA implementation, and CUDA int8 in PyTorch itself
(torch._int_mm) is a private building block, not a quantization of a model; on CUDA use
`--dtype bf16`. (torch 2.13 warns that torch.ao.quantization moves to torchao; it still works, and
torchao is not a dependency we take.)
"""

from __future__ import annotations

import gc
import warnings

import torch

from specdecode.backends.precision import FP32, Precision
from specdecode.errors import UserError

QUANTS = ("none", "int8")


def check(quant: str, precision: Precision, device: str | None) -> str:
    """Validate a --*-quant value against the precision and device; returns it."""
    if quant not in QUANTS:
        raise UserError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    if quant == "int8":
        if precision != FP32:
            raise UserError(f"int8 quantization starts from fp32 weights; got --dtype {precision}")
        if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
            raise UserError(
                "int8 quantization uses torch's dynamic int8 kernels, which run on CPU only; "
                "on CUDA use --dtype bf16 (or --device cpu)"
            )
    return quant


class LossyTargetWarning(UserWarning):
    """Speculation on this target is not token-identical to plain decoding on it."""


INT8_TARGET = (
    "--target-quant int8 with speculation: greedy output may differ from plain int8 decoding. torch's "
    "dynamic int8 quantizes a forward's activations with one scale per call, so a verification over "
    "k + 1 rows rounds differently from k + 1 one-token steps (docs/cross_vocab_int8.md); for a "
    "quantized target that stays token-identical use a GGUF file (--dtype gguf)"
)


def warn_if_lossy(target_quant: str, speculates: bool) -> bool:
    """Warn (LossyTargetWarning) where the losslessness promise does not hold: an int8 target that
    speculates. -> whether it warned."""
    if target_quant == "int8" and speculates:
        warnings.warn(INT8_TARGET, LossyTargetWarning, stacklevel=3)
        return True
    return False


def quantize(hf_model):
    """In place: the decoder's nn.Linear layers -> torch.ao dynamic int8 linears. -> hf_model"""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao -> torchao migration notice
        warnings.simplefilter("ignore", UserWarning)  # quantized tensor creation is deprecated, still works
        quantize_dynamic(
            hf_model.base_model,
            {torch.nn.Linear: per_channel_dynamic_qconfig},
            dtype=torch.qint8,
            inplace=True,
        )
    with torch.no_grad():
        for param in hf_model.parameters():  # the rest moves off the safetensors file mapping, so that
            param.data = param.data.clone()  # the fp32 weights now in int8 are unmapped, not kept resident
    gc.collect()  # the replaced fp32 linears sit in reference cycles: measured 70 MB kept without this
    return hf_model


def is_int8(module) -> bool:
    return isinstance(module, torch.ao.nn.quantized.dynamic.Linear)


class Int8Linears:
    """y = [x W_1^T + b_1 | x W_2^T + b_2 | ...] for torch.ao dynamic int8 linears, called on their
    prepacked weights (the fp32 path fuses q|k|v and gate|up into one matrix; int8 weights stay as
    torch packed them, one call each)."""

    def __init__(self, modules: list):
        self.packed = [m._packed_params._packed_params for m in modules]
        self.out_features = sum(m.out_features for m in modules)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] fp32 -> [..., out_features]
        outs = [torch.ops.quantized.linear_dynamic(x, p, True) for p in self.packed]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

"""The decoder layer, written once in Python: its linears (float, prepacked through kernels.cpp, or a
GGUF file's blocks: gguf_weights.QuantLinear), norms, rotary embedding and attention inputs, and the
KV cache's growth. FastLlama (fast_llama.py) and BatchedLlama (batch_model.py) run these layers one
op at a time or, on the native stack (stack.py), in one call that gives every row the same bits.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.backends import kernels as fused_kernels
from specdecode.backends import quant
from specdecode.backends.gguf_repack import quantize_q4, quantize_q8
from specdecode.backends.gguf_weights import QuantLinear

# Families whose forward is Llama's up to named switches (Layer, FastLlama.__init__): q/k/v biases
# (Qwen2), per-head q/k RMSNorm (Qwen3), fused qkv and gate_up matrices (Phi-3); Mistral is Llama.
SUPPORTED = {"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text"}
# Gemma 3 (text): embedding scaled by sqrt(hidden), (1 + w) norms, norms after attention and MLP,
# GELU-tanh MLP, q/k norms, its own attention scale, sliding-window layers with a local rotary table.
GEMMA = {"gemma3_text"}
ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}
CACHE_BLOCK = 256  # cache capacity grows in multiples of this many positions


class Linear:
    """y = x W^T + b. On CPU in fp32 the weight is prepacked for oneDNN: on the machines we measured
    (AVX2, MKL sgemm) this made a 1-token GEMV about 2x faster and a 4..9-token GEMM 3x faster
    than F.linear, which is what makes verifying k drafts cost little more than one token."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias, self.packed = weight, bias, None
        self.out_features = weight.shape[0]
        if (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
        ):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
                self.weight = None  # the packed copy replaces it (for fused q|k|v, gate|up: frees the cat)
            except (RuntimeError, AttributeError):
                self.packed = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class FusedLinear:
    """y = x W^T (+ b) through kernels.linear: W float32 or bfloat16 (read as is, so bf16 weights
    move half the bytes), x and y float32. For decoding and verification (a few rows of x) it
    reads every weight row once for all rows, and it gives a row the same bits whatever the other
    rows, so verifying k drafts costs about one decode step and matches it exactly. More than
    kernels.DENSE_ROWS rows go to torch's dense GEMM."""

    def __init__(self, ops, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.ops, self.weight = ops, weight.contiguous()
        self.bias = bias.float() if bias is not None else None  # added to float32 outputs
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        if flat.shape[0] > fused_kernels.DENSE_ROWS:  # a long prefill or a big batch: dense GEMM
            return F.linear(flat, self.weight.float(), self.bias).view(*x.shape[:-1], self.out_features)
        if self.bias is None and x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():
            return self.ops.linear(x, self.weight)  # the fused forward's case, without reshaping
        y = self.ops.linear(flat.contiguous(), self.weight)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features)


def head_linear(
    weight: torch.Tensor, ops=None, bias: torch.Tensor | None = None, int8: bool = False, bits: int = 8
):
    """A drafter's linear at inference: beside a target whose linears take 8-bit activations (`int8`,
    `--dtype gguf`), the target's own path: the weight quantized to 8 bits per 16
    (gguf_repack.quantize_q8) in the interleaved layout, a quarter of fp32's bytes, or with `bits` 4 to
    4 bits per 32 (quantize_q4: a head step streams ~40% fewer bytes); else with the
    target's fused kernels (`ops`, FastLlama.kernels) FusedLinear over the weight in bfloat16, which
    reads half of fp32's bytes and, for the one row of a draft step, beats oneDNN's fp32 product
    (docs/results/bf16_head_linears_heldout2_zen4_2threads.json); else Linear."""
    if int8 and ops is not None and weight.shape[1] % 32 == 0:
        quantize = quantize_q4 if bits == 4 else quantize_q8
        return QuantLinear(ops, [quantize(weight)], int8_activations=True, bias=bias)
    if ops is not None and weight.shape[1] % 16 == 0:
        return FusedLinear(ops, weight.bfloat16(), bias)
    return Linear(weight, bias)


class PackedLinear(nn.Module):
    """Inference-only stand-in for an nn.Linear (head_linear)."""

    def __init__(self, linear: nn.Linear, ops=None, int8: bool = False, bits: int = 8):
        super().__init__()
        bias = linear.bias.detach().float() if linear.bias is not None else None
        weight = linear.weight.detach().float()  # bf16: a copy a linear
        self.linear = head_linear(weight, ops, bias, int8, bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def pack_linears(module: nn.Module, ops=None, int8: bool = False, bits: int = 8) -> nn.Module:
    """Replace every nn.Linear inside `module` by a PackedLinear (for drafter heads at inference);
    ops: the target's fused kernels (FastLlama.kernels), None for oneDNN's fp32 path; int8: the
    target's linears take 8-bit activations; bits: their weights' (8 or 4; head_linear)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, ops, int8, bits))
        else:
            pack_linears(child, ops, int8, bits)
    return module


class Layer:
    def __init__(
        self,
        hf_layer,
        linear,
        norm_dtype: torch.dtype,
        act=F.silu,
        norm_offset: float = 0.0,
        rope_kind: str = "full_attention",
        window: int | None = None,
        linears: tuple | None = None,
    ):
        """linear: (weight, bias) -> a callable x -> x W^T + b (Linear or FusedLinear); act: the MLP's
        gate activation; norm_offset: 1 for Gemma's (1 + w) RMSNorm weights; rope_kind: which rotary
        table (Gemma 3: local or global); window: sliding-window layers see the last `window` positions;
        linears: (qkv, o, gate_up, down) built elsewhere (a GGUF file's blocks), instead of `linear`'s."""
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.act, self.rope_kind, self.window = act, rope_kind, window
        weight = partial(norm_weight, offset=norm_offset, dtype=norm_dtype)
        # Gemma 3 norms the attention and MLP outputs too, and names its pre-MLP norm apart
        sandwich = hasattr(hf_layer, "pre_feedforward_layernorm")
        self.norm1 = weight(hf_layer.input_layernorm)
        self.norm2 = weight(
            hf_layer.pre_feedforward_layernorm if sandwich else hf_layer.post_attention_layernorm
        )
        self.post_attn_norm = weight(hf_layer.post_attention_layernorm) if sandwich else None
        self.post_mlp_norm = weight(hf_layer.post_feedforward_layernorm) if sandwich else None
        # Qwen3 and Gemma 3: each head's q and k RMS-normed before the rotary embedding
        self.qk_norms = (weight(attn.q_norm), weight(attn.k_norm)) if hasattr(attn, "q_norm") else None
        if linears is not None:
            self.qkv, self.o, self.gate_up, self.down = linears
            return
        if hasattr(attn, "qkv_proj"):  # Phi-3: q|k|v and gate|up already fused in the checkpoint
            mods = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            self.qkv, self.o, self.gate_up, self.down = (
                quant.Int8Linears([m]) if quant.is_int8(m) else linear(m.weight, m.bias) for m in mods
            )
            return
        if quant.is_int8(attn.q_proj):  # quant.quantize ran on the HF model: call its int8 weights
            self.qkv = quant.Int8Linears([attn.q_proj, attn.k_proj, attn.v_proj])
            self.o = quant.Int8Linears([attn.o_proj])
            self.gate_up = quant.Int8Linears([mlp.gate_proj, mlp.up_proj])
            self.down = quant.Int8Linears([mlp.down_proj])
            return
        biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        self.qkv = linear(
            torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            torch.cat(biases) if all(b is not None for b in biases) else None,
        )
        self.o = linear(attn.o_proj.weight, attn.o_proj.bias)
        self.gate_up = linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), None)
        self.down = linear(mlp.down_proj.weight, None)

    def attention_inputs(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, hidden] rows (any sequences), cos/sin: [N, d] each row's rotary position
        -> q [N, heads, d], k and v [N, kv_heads, d], q and k rotated."""
        qkv = self.norm_qk(self.qkv(rms_norm(x, self.norm1, eps)), heads, kv_heads, eps)
        qkv = qkv.view(x.shape[0], heads + 2 * kv_heads, -1)
        q, k = rope(qkv[:, : heads + kv_heads], cos[:, None], sin[:, None]).split([heads, kv_heads], dim=1)
        return q, k, qkv[:, heads + kv_heads :]

    def norm_qk(self, qkv: torch.Tensor, heads: int, kv_heads: int, eps: float) -> torch.Tensor:
        """qkv: [N, (heads + 2 kv_heads) d] -> the same with q and k RMS-normed per head (Qwen3);
        unchanged for the families without q/k norms."""
        if self.qk_norms is None:
            return qkv
        n, (wq, wk) = qkv.shape[0], self.qk_norms
        parts = qkv.view(n, heads + 2 * kv_heads, -1).split([heads, kv_heads, kv_heads], dim=1)
        return torch.cat([rms_norm(parts[0], wq, eps), rms_norm(parts[1], wk, eps), parts[2]], 1).view(n, -1)

    def finish(self, x: torch.Tensor, attn: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [N, hidden] the residual stream, attn: [N, heads*d] -> the layer's output [N, hidden]:
        output projection and the gated MLP, each added to the residual (normed first in Gemma 3)."""
        o = self.o(attn)
        x = x + (o if self.post_attn_norm is None else rms_norm(o, self.post_attn_norm, eps))
        gate, up = self.gate_up(rms_norm(x, self.norm2, eps)).chunk(2, dim=-1)
        h = self.down(self.act(gate) * up)
        return x + (h if self.post_mlp_norm is None else rms_norm(h, self.post_mlp_norm, eps))


def norm_offset(cfg) -> float:
    """What an RMSNorm adds to its stored weight: 1 for Gemma (it stores w of 1 + w), else 0."""
    return 1.0 if cfg.model_type in GEMMA else 0.0


def norm_weight(norm: nn.Module, offset: float, dtype: torch.dtype) -> torch.Tensor:
    """An RMSNorm's multiplier: its weight, or 1 + weight (Gemma), in `dtype`."""
    return (norm.weight.float() + offset).to(dtype) if offset else norm.weight.to(dtype)


def rope_type(cfg) -> str:
    scaling = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def activation_name(cfg) -> str:
    return getattr(cfg, "hidden_activation", None) or cfg.hidden_act


def check_config(cfg, max_length: int | None) -> None:
    """ValueError naming what this forward does not implement (the caller falls back to HF's)."""
    if cfg.model_type not in SUPPORTED:
        raise ValueError(f"FastLlama does not support model_type {cfg.model_type!r}")
    if getattr(cfg, "mlp_bias", False) or activation_name(cfg) not in ACTIVATIONS:
        raise ValueError(f"FastLlama supports bias-free silu and gelu-tanh MLPs, not {cfg.model_type}'s")
    if cfg.model_type in GEMMA and (
        getattr(cfg, "attn_logit_softcapping", None) or getattr(cfg, "final_logit_softcapping", None)
    ):
        raise ValueError("FastLlama has no logit soft-capping (Gemma 2 style)")
    window = getattr(cfg, "sliding_window", None)
    uses_window = getattr(cfg, "use_sliding_window", cfg.model_type == "mistral")
    if cfg.model_type in GEMMA:
        uses_window = False  # Gemma 3's sliding layers are implemented (Layer.window)
    context = max_length or getattr(cfg, "max_position_embeddings", 2048)
    if uses_window and window is not None and window < context:
        raise ValueError(f"FastLlama has no sliding-window attention ({cfg.model_type}, window {window})")
    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("FastLlama rotates whole heads; partial_rotary_factor is not supported")


def window_mask(
    mask: torch.Tensor | None, positions: torch.Tensor, end: int, window: int
) -> torch.Tensor | None:
    """mask [n, end] (None: causal from slot 0) narrowed so that the query at positions[i] sees no
    slot before positions[i] - window + 1; the same mask when no query reaches that far."""
    if int(positions.max()) < window:
        return mask
    keys = torch.arange(end, device=positions.device)
    if mask is None:
        mask = keys[None, :] <= positions[:, None]
    return mask & (positions[:, None] - keys[None, :] < window)


def grow_kv(k_cache, v_cache, needed: int, max_length: int, dims: tuple[int, int, int, int], dtype, device):
    """KV caches [layers, slots, kv_heads, capacity, d] (None: none yet) with room for `needed`
    positions: the same tensors when they have it, else copies grown to a multiple of CACHE_BLOCK,
    at least twice the capacity they had (so a long prompt arriving in chunks copies the cache a few
    times, not once per chunk: with 20 server slots each copy of a 4,096-position cache moved 3.8 GB
    and stalled every stream for seconds). dims: (layers, slots, kv_heads, d)."""
    have = 0 if k_cache is None else k_cache.shape[3]
    if needed <= have:
        return k_cache, v_cache
    layers, slots, kv_heads, d = dims
    capacity = -(-max(needed, 2 * have) // CACHE_BLOCK) * CACHE_BLOCK
    shape = (layers, slots, kv_heads, min(max_length, capacity), d)
    k = torch.zeros(shape, dtype=dtype, device=device)
    v = torch.zeros(shape, dtype=dtype, device=device)
    if have:
        k[:, :, :, :have] = k_cache
        v[:, :, :, :have] = v_cache
    return k, v


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF's Llama: statistics in float32 whatever the activation dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half layout: x [..., d], cos/sin broadcastable to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin

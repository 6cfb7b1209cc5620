"""A lean forward for Llama-architecture models with a preallocated KV cache.

Weights are taken from the loaded Hugging Face model (no copy for q/k/v/o and the MLP beyond one
fused q|k|v and gate|up matrix per layer); HFModel stays the general fallback for other
architectures. Rolling back rejected drafts is only a change of `length`: stale keys and values
beyond it are overwritten by the next extend (as in gpt-fast).

Why: on a small CPU model the per-op overhead of the general HF forward (mask building, cache
objects, module hooks) costs as much as the matmuls themselves; every saved millisecond multiplies
with speculation. On CPU in fp32 and bf16 the forward of up to 64 tokens goes further: kernels.cpp
does the matmuls (bf16 weights read as bf16) and fuses the small ops between them (_forward_fused);
the eager _forward stays for prefill, GPUs and machines without a C++ compiler.
"""

from __future__ import annotations

import copy
import sys
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.backends import kernels as fused_kernels
from specdecode.backends import quant
from specdecode.backends import stack as native_stack
from specdecode.backends.embedding import Embedding
from specdecode.backends.gguf_weights import QuantLinear, quantize_q8
from specdecode.backends.lm import Output, layer_ids, tree_attention

# Families whose forward is Llama's up to named switches (Layer, FastLlama.__init__): q/k/v biases
# (Qwen2), per-head q/k RMSNorm (Qwen3), fused qkv and gate_up matrices (Phi-3); Mistral is Llama.
SUPPORTED = {"llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text"}
# Gemma 3 (text): embedding scaled by sqrt(hidden), (1 + w) norms, norms after attention and MLP,
# GELU-tanh MLP, q/k norms, its own attention scale, sliding-window layers with a local rotary table.
GEMMA = {"gemma3_text"}
ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh")}
CACHE_BLOCK = 256  # cache capacity grows in multiples of this many positions
_FUSED_MAX_TOKENS = fused_kernels.DENSE_ROWS  # longer forwards: SDPA and dense GEMMs


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


def head_linear(weight: torch.Tensor, ops=None, bias: torch.Tensor | None = None, int8: bool = False):
    """A drafter's linear at inference: beside a target whose linears take 8-bit activations (`int8`,
    `--dtype gguf`) on AVX-512 VNNI, the target's own path: the weight quantized to 8 bits per 16
    (gguf_weights.quantize_q8) in the interleaved layout, a quarter of fp32's bytes; else with the
    target's fused kernels (`ops`, FastLlama.kernels) FusedLinear over the weight in bfloat16, which
    reads half of fp32's bytes and, for the one row of a draft step, took a third of oneDNN's fp32 time
    for the EAGLE head (Zen 4); else Linear."""
    if int8 and ops is not None and ops.vnni_rows() > 0 and weight.shape[1] % 32 == 0:
        return QuantLinear(ops, [quantize_q8(weight)], int8_activations=True, bias=bias)
    if ops is not None and weight.shape[1] % 16 == 0:
        return FusedLinear(ops, weight.bfloat16(), bias)
    return Linear(weight, bias)


class PackedLinear(nn.Module):
    """Inference-only stand-in for an nn.Linear (head_linear)."""

    def __init__(self, linear: nn.Linear, ops=None, int8: bool = False):
        super().__init__()
        bias = linear.bias.detach() if linear.bias is not None else None
        self.linear = head_linear(linear.weight.detach(), ops, bias, int8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def pack_linears(module: nn.Module, ops=None, int8: bool = False) -> nn.Module:
    """Replace every nn.Linear inside `module` by a PackedLinear (for drafter heads at inference);
    ops: the target's fused kernels (FastLlama.kernels), None for oneDNN's fp32 path; int8: the
    target's linears take 8-bit activations (head_linear)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child, ops, int8))
        else:
            pack_linears(child, ops, int8)
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
    ):
        """linear: (weight, bias) -> a callable x -> x W^T + b (Linear or FusedLinear); act: the MLP's
        gate activation; norm_offset: 1 for Gemma's (1 + w) RMSNorm weights; rope_kind: which rotary
        table (Gemma 3: local or global); window: sliding-window layers see the last `window` positions."""
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


def _rope_type(cfg) -> str:
    scaling = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def _activation(cfg) -> str:
    return getattr(cfg, "hidden_activation", None) or cfg.hidden_act


def check_config(cfg, max_length: int | None) -> None:
    """ValueError naming what this forward does not implement (the caller falls back to HF's)."""
    if cfg.model_type not in SUPPORTED:
        raise ValueError(f"FastLlama does not support model_type {cfg.model_type!r}")
    if getattr(cfg, "mlp_bias", False) or _activation(cfg) not in ACTIVATIONS:
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


def _window(mask: torch.Tensor | None, positions: torch.Tensor, end: int, window: int) -> torch.Tensor | None:
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


class FastLlama:
    """CausalLM protocol (reset / extend / truncate, extend_tree / keep) for LlamaForCausalLM weights."""

    def __init__(self, hf_model, max_length: int | None = None, fused: bool = True, int8: bool = False):
        """fused: run fp32 and bf16 on CPU through kernels.cpp when it builds (see kernels.py);
        there bf16 means bf16 weights with float32 activations, cache and accumulation. int8: float
        weights beside a `--dtype gguf` target (a distilled draft) take its path where the CPU has the
        VNNI kernels: every linear quantized to 8 bits per 16 (head_linear), 8-bit activations, every
        forward row-exact, the layers in one native stack."""
        cfg = hf_model.config
        check_config(cfg, max_length)
        self.hf = hf_model.eval()
        self.config = cfg
        # a GGUF skeleton's weights stay on the meta device (gguf_model.py): its norms say where it runs
        self.device = hf_model.model.norm.weight.device
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        cpu = self.device.type == "cpu" and hf_model.dtype in (torch.float32, torch.bfloat16)
        widths = (cfg.hidden_size, cfg.intermediate_size, self.heads * self.head_dim)  # the linears' inputs
        self.kernels = fused_kernels.load() if fused and cpu and all(w % 16 == 0 for w in widths) else None
        self.int8_activations = False  # gguf_model.keep_quantized sets it for `--dtype gguf`
        # dtype of activations and the KV cache (int8 linears keep fp32 activations)
        self.dtype = torch.float32 if self.kernels else hf_model.dtype
        int8 = (
            int8
            and self.kernels is not None
            and self.kernels.vnni_rows() > 0
            and all(w % 32 == 0 for w in widths)
        )

        def int8_linear(weight, bias):  # float weights onto the target's 8-bit path
            return head_linear(weight, self.kernels, bias, int8=True)

        linear = int8_linear if int8 else partial(FusedLinear, self.kernels) if self.kernels else Linear
        self.eps = cfg.rms_norm_eps
        self.max_length = max_length or getattr(cfg, "max_position_embeddings", 2048)
        if _rope_type(cfg) == "longrope":  # Phi-3: its short factors hold up to the original context
            self.max_length = min(self.max_length, cfg.original_max_position_embeddings)
        self.embedding = Embedding(hf_model.get_input_embeddings().weight)  # gguf: its blocks (gguf_model)
        self.lm_head = linear(hf_model.get_output_embeddings().weight, None)
        self.vocab_size = self.lm_head.out_features
        gemma = cfg.model_type in GEMMA
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5) if gemma else None
        self.qk_scale = cfg.query_pre_attn_scalar**-0.5 if gemma else None  # None: 1 / sqrt(head_dim)
        offset = norm_offset(cfg)
        self.final_norm = norm_weight(hf_model.model.norm, offset, self.dtype)
        kinds = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
        with torch.no_grad():
            self.layers = [
                Layer(
                    layer,
                    linear,
                    self.dtype,
                    ACTIVATIONS[_activation(cfg)],
                    offset,
                    kind,
                    cfg.sliding_window if kind == "sliding_attention" else None,
                )
                for layer, kind in zip(hf_model.model.layers, kinds)
            ]
            # cos/sin for every position from HF's own rotary module (covers rope scaling variants;
            # Gemma 3 keeps one table per layer kind)
            positions = torch.arange(self.max_length, device=self.device)[None]
            probe = torch.empty(0, dtype=self.dtype, device=self.device)
            self.rope = {
                kind: tuple(
                    t[0]
                    for t in (
                        hf_model.model.rotary_emb(probe, positions, kind)
                        if gemma
                        else hf_model.model.rotary_emb(probe, positions)
                    )
                )
                for kind in set(kinds)
            }  # kind -> (cos, sin) [max_length, head_dim]
            self.cos, self.sin = self.rope.get("full_attention", next(iter(self.rope.values())))
        self.k_cache = self.v_cache = None
        self.fused_rows = _FUSED_MAX_TOKENS  # longer forwards: SDPA and dense GEMMs (see rows_independent)
        self.stack = None  # the layers in one native call (backends/stack.py), set by keep_quantized
        if int8:
            self.int8_activations = True
            self.rows_independent()
            self.stack = native_stack.build(self)
        self.reset()

    def rows_independent(self) -> None:
        """Every forward through the fused kernels, whatever its length: for linears that give a row
        the same bits in any call (gguf on the VNNI kernels), so that a prompt's prefill, a verification
        and a batched server row each compute exactly what a decoding step computes."""
        self.fused_rows = sys.maxsize

    def reset(self) -> None:
        self.length = 0

    def fork(self) -> "FastLlama":
        twin = copy.copy(self)
        twin.k_cache = twin.v_cache = None
        twin.reset()
        return twin

    def head_rows(self, index: torch.Tensor):
        if isinstance(self.lm_head, (Linear, FusedLinear)):
            return head_linear(self.hf.get_output_embeddings().weight.detach()[index].float(), self.kernels)
        return self.lm_head.rows(index)  # a quantized head (gguf_weights.QuantLinear): rows still quantized

    def with_head_rows(self, index: torch.Tensor) -> "FastLlama":
        """A twin (the same weights, a cache of its own) whose logits are those of the LM-head rows
        `index` [Vd] only: a draft model over its most frequent tokens reads a fraction of its head."""
        twin = self.fork()
        twin.lm_head = self.head_rows(index)
        twin.vocab_size = len(index)
        if self.stack is not None:  # the head is part of the one native call
            twin.stack = native_stack.build(twin)
        return twin

    def output_weight(self) -> torch.Tensor:
        """The LM head's float weights [V, H]: the HF module's, or a GGUF file's quantized head
        dequantized (its skeleton holds no float copy: gguf_model.py)."""
        weight = self.hf.get_output_embeddings().weight
        return self.lm_head.dequantize() if weight.device.type == "meta" else weight

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def _ensure_capacity(self, needed: int) -> None:
        self.k_cache, self.v_cache = grow_kv(
            self.k_cache,
            self.v_cache,
            needed,
            self.max_length,
            (len(self.layers), 1, self.kv_heads, self.head_dim),
            self.dtype,
            self.device,
        )

    def extend(self, tokens: torch.Tensor, num_logits: int = 0) -> torch.Tensor:
        """tokens: [n] -> logits [n, V] float32 (last num_logits rows if > 0); appends to the cache."""
        return self.forward(tokens, num_logits=num_logits).logits

    def extend_tree(
        self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor
    ) -> torch.Tensor:
        return self.forward(tokens, positions=positions, tree_mask=tree_mask).logits

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        *,
        num_logits: int = 0,
        layers: tuple[int, ...] = (),
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> Output:
        """As CausalLM.forward. tokens: [n] into cache slots length..length+n-1. A chain's query i
        (position start+i) sees keys 0..start+i; a tree's token i sits at rotary position
        positions[i] and attends to slot j of the last t slots where tree_mask[i, j], and to every
        slot before (follow with keep() or truncate). A sliding-window layer's query at position p
        sees no key before p - window + 1."""
        n, start = tokens.shape[0], self.length
        self._check_room(start + n)
        ids = layer_ids(layers, len(self.layers))
        if tree_mask is None and self.stack is not None and self.stack.by_ids:  # no torch ops per step
            where = ([0], [start], [n])
            logits, captured = self.stack.chains(
                self, self.k_cache, self.v_cache, tokens.tolist(), where, set(ids), _last_rows(n, num_logits)
            )
            self.length = start + n
        else:
            logits, captured = self._forward_rows(tokens, num_logits, positions, tree_mask, set(ids))
        return Output(logits, torch.cat([captured[i] for i in ids], -1) if ids else None)

    def _forward_rows(self, tokens, num_logits: int, positions, tree_mask, capture: set[int]):
        """forward's rows prepared in torch (rotary rows, masks) for _forward or _forward_fused ->
        (logits, {layer: its output})."""
        n, start = tokens.shape[0], self.length
        if tree_mask is not None:
            positions = positions.to(self.device)
            mask = tree_attention(tree_mask.to(self.device), start)  # [n, start+n]
        else:
            # a fresh prefill is plain causal attention: SDPA's fused causal kernel, no [n, n] mask
            mask = (
                torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(start)
                if n > 1 and start
                else None
            )
            positions = torch.arange(start, start + n, device=self.device)
        ropes = {kind: (cos[positions], sin[positions]) for kind, (cos, sin) in self.rope.items()}
        masks = {None: mask} | {
            w: _window(mask, positions, start + n, w) for w in {layer.window for layer in self.layers} if w
        }
        forward = self._forward_fused if self.kernels is not None and n <= self.fused_rows else self._forward
        return forward(tokens, ropes, masks, num_logits, capture)

    @torch.inference_mode()
    def keep(self, length: int, indices: list[int]) -> None:
        """Keep cache slots 0..length-1, then the slots `indices` (ascending, >= length) moved to
        length, length+1, ... (the accepted path of a tree; its positions already match)."""
        m = len(indices)
        if indices != list(range(length, length + m)):
            idx = torch.tensor(indices, dtype=torch.long, device=self.device)
            self.k_cache[:, :, :, length : length + m] = self.k_cache[:, :, :, idx]  # gather copies first
            self.v_cache[:, :, :, length : length + m] = self.v_cache[:, :, :, idx]
        self.length = length + m

    def _check_room(self, end: int) -> None:
        if end > self.max_length:
            raise ValueError(f"sequence of {end} tokens exceeds max_length {self.max_length}")
        self._ensure_capacity(end)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [n] -> their input rows [n, hidden] (Gemma: scaled by sqrt(hidden))."""
        x = self.embedding(tokens)
        return x if self.embed_scale is None else x * self.embed_scale.to(x.dtype)

    def _forward(self, tokens, ropes, masks, num_logits: int, capture: set[int]):
        """tokens: [n] into cache slots length..length+n-1; ropes: rotary kind -> (cos, sin) [n, d];
        masks: window (None: full) -> [n, length+n] bool, or None: causal from an empty cache (or a
        single token, which sees everything) -> (logits [n or num_logits, V] float32, {layer: its
        output [n, H]} for the layers in `capture`, the last one after the final norm)."""
        n, start = tokens.shape[0], self.length
        end = start + n
        h, d, kvh = self.heads, self.head_dim, self.kv_heads
        x = self.embed_tokens(tokens).to(self.dtype)  # [n, hidden]
        captured = {}
        for i, layer in enumerate(self.layers):
            mask = masks[layer.window]
            q, k, v = layer.attention_inputs(x, *ropes[layer.rope_kind], h, kvh, self.eps)  # [n, h|kvh, d]
            self.k_cache[i, 0, :, start:end] = k.transpose(0, 1)
            self.v_cache[i, 0, :, start:end] = v.transpose(0, 1)
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                self.k_cache[i, :, :, :end],
                self.v_cache[i, :, :, :end],
                attn_mask=mask,
                is_causal=mask is None and n > 1,
                enable_gqa=True,
                scale=self.qk_scale,
            )  # [1, h, n, d]
            x = layer.finish(x, attn[0].transpose(0, 1).reshape(n, h * d), self.eps)
            if i in capture:
                captured[i] = x
        self.length = end
        x = rms_norm(x, self.final_norm, self.eps)
        if len(self.layers) - 1 in capture:
            captured[len(self.layers) - 1] = (
                x  # as HF's output_hidden_states: the last entry is after the norm
            )
        if num_logits:
            x = x[-num_logits:]
        return self.lm_head(x).float(), captured

    def _forward_fused(self, tokens, ropes, masks, num_logits: int, capture: set[int]):
        """_forward with kernels.cpp between the matmuls: one call per group of small ops."""
        n, start = tokens.shape[0], self.length
        x = self.embed_tokens(tokens).float().contiguous()  # [n, hidden]
        where = (torch.zeros(1, dtype=torch.long), torch.tensor([start]), torch.tensor([n]))  # slot 0
        logits, captured = fused_layers(
            self, x, self.k_cache, self.v_cache, ropes, masks, where, capture, _last_rows(n, num_logits)
        )
        self.length = start + n
        return logits, captured


def _last_rows(n: int, num_logits: int) -> list[int]:
    """The rows of an n-row forward whose logits are returned: the last num_logits, all when 0."""
    return list(range(n - num_logits if num_logits else 0, n))


def fused_layers(
    m: FastLlama, x, k_cache, v_cache, ropes, masks, where, capture: set[int], logit_rows: list[int]
):
    """The layers and the LM head through kernels.cpp for rows of any sequences (FastLlama's one
    sequence, or BatchedLlama's rows of many): x [N, hidden] float32, the residual stream (updated in
    place); k_cache, v_cache [layers, slots, kv_heads, cap, d]; ropes: rotary kind -> (cos, sin) [N, d];
    masks: window (None: full) -> [N, L] bool (row i sees key j of its slot where true), or None for
    causal rows; where: (slots, starts, counts) [B] long, sequence b's rows next in x; logit_rows: the
    rows whose logits are wanted -> (their logits [len(logit_rows), V] float32, {layer: its output
    [N, hidden]} for `capture`, the last one after the final norm)."""
    if m.stack is not None:
        return m.stack(x, k_cache, v_cache, ropes, masks, where, capture, logit_rows)
    ops = m.kernels
    xn = ops.add_rms_norm(x, None, m.layers[0].norm1, m.eps)
    norms = [layer.norm1 for layer in m.layers[1:]] + [m.final_norm]  # the norm after each layer
    ropes = {kind: (cos.contiguous(), sin.contiguous()) for kind, (cos, sin) in ropes.items()}
    captured = {}
    for i, layer in enumerate(m.layers):
        qkv = layer.norm_qk(layer.qkv(xn), m.heads, m.kv_heads, m.eps)
        attn = ops.attention(
            qkv,
            k_cache[i],
            v_cache[i],
            *ropes[layer.rope_kind],
            masks[layer.window],
            *where,
            m.heads,
            m.kv_heads,
            m.qk_scale or 0.0,
        )  # [N, h*d]
        o = layer.o(attn)
        if layer.post_attn_norm is not None:
            o = ops.add_rms_norm(o, None, layer.post_attn_norm, m.eps)
        xn = ops.add_rms_norm(x, o, layer.norm2, m.eps)
        gate_up = layer.gate_up(xn)
        if layer.act is F.silu:
            h = layer.down(ops.silu_mul(gate_up))
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            h = layer.down((layer.act(gate) * up).contiguous())
        if layer.post_mlp_norm is not None:
            h = ops.add_rms_norm(h, None, layer.post_mlp_norm, m.eps)
        xn = ops.add_rms_norm(x, h, norms[i], m.eps)
        if i in capture:
            captured[i] = x.clone()
    if len(m.layers) - 1 in capture:
        captured[len(m.layers) - 1] = xn  # as HF's output_hidden_states: the last entry is after the norm
    return m.lm_head(xn[logit_rows]).float(), captured

"""The whole layer stack in one native call (stack.cpp) for `--dtype gguf`, on every ISA's tiles.

fast_llama.fused_layers runs a forward as ~9 kernel calls per layer; for a pre-norm model (Llama's form,
with Qwen2's biases, Qwen3's q/k norms, Gemma 3's q/k and sandwich norms and GELU) whose linears are all
interleaved tile matrices, `build` makes one kernels.Stack at load instead, and
fused_layers hands it the whole forward, the LM head included when that is interleaved too. Its rows
carry the bits of the per-op path (tested), so every invariant of that path (a row never depends on
the others) holds unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdecode.backends.layer import ACTIVATIONS

# The block table of a one-sequence cache ([layers, 1, kv_heads, capacity, d]: one block of its
# capacity): FastLlama's and the EAGLE head's, for the native calls that read caches by the block.
ONE_BLOCK = torch.zeros(1, 1, dtype=torch.long)

# a linear's interleaved matrices: QuantLinear.interleaved_parts
Parts = Sequence[tuple[str, torch.Tensor, torch.Tensor, int]]

# the MLP gates stack.cpp computes: layer.ACTIVATIONS' functions -> stack.cpp's names
ACTIVATION_NAMES = {F.silu: "silu", ACTIVATIONS["gelu_pytorch_tanh"]: "gelu_tanh"}


@dataclass(frozen=True)
class StackParams:
    """What kernels.Stack is built from, by name (stack.cpp reads each field by its name). Per-layer
    lists have one entry per layer; a norm is its float32 multiplier [H] (Gemma's 1 + w already added)."""

    qkv: Sequence[Parts]  # per layer, q|k|v's parts (their rows q, k, v)
    o: Sequence[Parts]
    gate_up: Sequence[Parts]  # gate | up
    down: Sequence[Parts]
    norm1: Sequence[torch.Tensor]  # before attention
    norm2: Sequence[torch.Tensor]  # before the MLP
    final_norm: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    qk_scale: float = 0.0  # the attention's q.k scale; 0: 1 / sqrt(head_dim)
    rope_kind: Sequence[int] = ()  # per layer, its rotary table's index in a call's cos, sin; empty: all 0
    window_kind: Sequence[int] = ()  # per layer, its mask's index in a call's masks; empty: all 0 (causal)
    head: Parts = ()  # the LM head's parts; empty: none (the caller applies its head)
    pair_norm: torch.Tensor | None = None  # [H]: the first q|k|v reads [pair_norm(emb); norm1(x)] (EAGLE)
    qkv_bias: Sequence[torch.Tensor] = ()  # empty, or per layer [(heads + 2 kv_heads) head_dim] (Qwen2)
    q_norm: Sequence[torch.Tensor] = ()  # empty, or per layer [head_dim]: each q head normed (Qwen3, Gemma 3)
    k_norm: Sequence[torch.Tensor] = ()  # as q_norm, for the k heads
    post_attn_norm: Sequence[torch.Tensor] = ()  # empty, or per layer [H]: attention's output normed (Gemma)
    post_mlp_norm: Sequence[torch.Tensor] = ()  # as post_attn_norm, for the MLP's output
    activation: str = "silu"  # the MLP's gate: "silu" or "gelu_tanh" (Gemma 3)


class NativeStack:
    """kernels.Stack over a FastLlama's layers, with the order of its rotary tables and masks."""

    def __init__(self, model):
        self.kinds = sorted(model.rope)  # rotary kind -> its index in the call's cos/sin lists
        self.windows = [None] + sorted({layer.window for layer in model.layers if layer.window})
        layers = model.layers

        def weight(w: torch.Tensor) -> torch.Tensor:
            return w.float().contiguous()

        qk_norms = [layer.qk_norms for layer in layers if layer.qk_norms is not None]  # all or none (build)
        sandwiched = [layer for layer in layers if layer.post_attn_norm is not None]  # Gemma 3: post norms
        self.native = model.kernels.Stack(
            StackParams(
                qkv=[layer.qkv.interleaved_parts(with_bias=True) for layer in layers],
                o=[layer.o.interleaved_parts() for layer in layers],
                gate_up=[layer.gate_up.interleaved_parts() for layer in layers],
                down=[layer.down.interleaved_parts() for layer in layers],
                norm1=[weight(layer.norm1) for layer in layers],
                norm2=[weight(layer.norm2) for layer in layers],
                final_norm=weight(model.final_norm),
                heads=model.heads,
                kv_heads=model.kv_heads,
                head_dim=model.head_dim,
                eps=model.eps,
                qk_scale=model.qk_scale or 0.0,
                rope_kind=[self.kinds.index(layer.rope_kind) for layer in layers],
                window_kind=[self.windows.index(layer.window) for layer in layers],
                head=model.lm_head.interleaved_parts() or [],
                qkv_bias=[layer.qkv.bias.contiguous() for layer in layers if layer.qkv.bias is not None],
                q_norm=[weight(q) for q, _ in qk_norms],
                k_norm=[weight(k) for _, k in qk_norms],
                post_attn_norm=[weight(layer.post_attn_norm) for layer in sandwiched],
                post_mlp_norm=[weight(layer.post_mlp_norm) for layer in sandwiched],
                activation=ACTIVATION_NAMES[layers[0].act],
            )
        )
        self.head = None if self.native.has_head else model.lm_head  # applied here when not native
        # chains (FastLlama's sequence, BatchedLlama's rows without trees) go to forward_ids, their
        # embedding (or its looked-up rows: embedding.py) and rotary rows gathered natively, when no
        # layer has a sliding window (their masks) nor the embedding a scale (Gemma)
        self.by_ids = self.windows == [None] and model.embed_scale is None

    def __call__(self, x, k_cache, v_cache, ropes, masks, where, capture: set[int], logit_rows: list[int]):
        """As fast_llama.fused_layers (its arguments and results)."""
        cos = [ropes[kind][0].contiguous() for kind in self.kinds]
        sin = [ropes[kind][1].contiguous() for kind in self.kinds]
        ids = sorted(capture)
        masks = [masks[w] for w in self.windows]
        native_rows = self._native_rows(logit_rows)
        out = self.native.forward(x, k_cache, v_cache, cos, sin, masks, *where, ids, native_rows, None)
        return self._results(out, ids, logit_rows)

    def chains(self, m, k_cache, v_cache, tokens: list[int], where, capture: set[int], logit_rows: list[int]):
        """As __call__ for chains of token ids, causal (needs by_ids): where = (slots, starts, counts)
        lists of ints and the block table; m: the FastLlama whose embedding and rotary tables to use."""
        ids = sorted(capture)
        cos = [m.rope[kind][0] for kind in self.kinds]
        sin = [m.rope[kind][1] for kind in self.kinds]
        ids_in, embed = m.embedding.gathered(tokens)
        out = self.native.forward_ids(
            ids_in, *where, embed, k_cache, v_cache, cos, sin, ids, self._native_rows(logit_rows), None
        )
        return self._results(out, ids, logit_rows)

    def _native_rows(self, logit_rows: list[int]) -> list[int]:
        """The rows whose logits the native call computes: all asked for, unless the head is applied here."""
        return logit_rows if self.head is None else []

    def _results(self, out, ids: list[int], logit_rows: list[int]):
        """A native call's [normed rows, logits, captured...] -> (logits of logit_rows, {layer: output})."""
        xn, logits, *outs = out
        if self.head is not None:
            logits = self.head(xn[logit_rows]).float()
        return logits, dict(zip(ids, outs))


def build(model) -> NativeStack | None:
    """A NativeStack for `model` (a FastLlama whose linears are gguf_weights.QuantLinear, from
    gguf_model.FileWeights) when every linear is made of interleaved tile matrices and its layers are
    pre-norm with a SiLU- or GELU-tanh-gated MLP; q|k|v biases (Qwen2), q/k norms (Qwen3, Gemma 3) and
    norms after attention and MLP (Gemma 3) each in every layer or in none; else None (fused_layers keeps
    its per-op path: float weights, matrices of other layouts)."""
    layers = model.layers
    for has in (
        lambda layer: layer.qkv.bias is not None,
        lambda layer: layer.qk_norms is not None,
        lambda layer: layer.post_attn_norm is not None,
        lambda layer: layer.post_mlp_norm is not None,
        lambda layer: layer.act,
    ):
        if len({has(layer) for layer in layers}) > 1:
            return None
    if layers[0].act not in ACTIVATION_NAMES:
        return None
    for layer in layers:
        if layer.qkv.interleaved_parts(with_bias=True) is None:
            return None
        if any(lin.interleaved_parts() is None for lin in (layer.o, layer.gate_up, layer.down)):
            return None
    return NativeStack(model) if model.dtype == torch.float32 else None

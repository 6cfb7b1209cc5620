"""A lean forward for the families of layer.SUPPORTED with a preallocated KV cache; HFModel
(models.py) stays the general fallback for other architectures. Rolling back rejected drafts is only
a change of `length`: stale keys and values beyond it are overwritten by the next extend (gpt-fast).

Which code runs my forward? One decision, made here at each forward (FastLlama.forward; BatchedLlama
makes the same one for its rows through `fused_layers`):
1. `stack` (stack.py, stack.cpp): the whole layer stack and the LM head in one native call. Built at
   load for `--dtype gguf` (tile.h's microkernel for this CPU) when every linear is interleaved
   (Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 3: gguf_model.load, stack.build); any number of rows.
   A chain of token ids without a sliding window or scaled embedding goes in as ids (`stack.chains`),
   everything else as rows prepared in torch.
2. `fused_layers` (kernels.cpp between the matmuls, ~9 calls a layer): the fused kernels built here
   (CPU, fp32/bf16/gguf) and at most `fused_rows` rows (kernels.DENSE_ROWS; any number when rows must
   keep a decoding step's bits: gguf's tiles).
3. `_forward` (torch ops and SDPA): everything else: long float prefills, GPUs, no C++ compiler.
The layer itself (linears, norms, rotary, attention inputs) is written once, in layer.py.
"""

from __future__ import annotations

import copy
import sys
from functools import partial

import torch
import torch.nn.functional as F

from specdecode.backends import kernels as fused_kernels
from specdecode.backends import stack as native_stack
from specdecode.backends.embedding import Embedding
from specdecode.backends.layer import (
    ACTIVATIONS,
    GEMMA,
    FusedLinear,
    Layer,
    Linear,
    activation_name,
    check_config,
    grow_kv,
    head_linear,
    norm_offset,
    norm_weight,
    rms_norm,
    rope_type,
    window_mask,
)
from specdecode.backends.lm import Output, layer_ids, tree_attention

_FUSED_MAX_TOKENS = fused_kernels.DENSE_ROWS  # longer forwards: SDPA and dense GEMMs


class FastLlama:
    """CausalLM protocol (reset / extend / truncate, extend_tree / keep) for LlamaForCausalLM weights."""

    def __init__(
        self, hf_model, max_length: int | None = None, fused: bool = True, int8: bool = False, weights=None
    ):
        """fused: run fp32 and bf16 on CPU through kernels.cpp when it builds (see kernels.py);
        there bf16 means bf16 weights with float32 activations, cache and accumulation. int8: float
        weights beside a `--dtype gguf` target (a distilled draft) take its path (the tile
        kernels): every linear quantized to 8 bits per 16 (head_linear), 8-bit activations, every
        forward row-exact, the layers in one native stack. weights: the linears, LM head and token
        embedding from a GGUF file's blocks (gguf_model.FileWeights), built here layer by layer in
        place of the float model's (`hf_model` is then a skeleton whose linears hold no weights)."""
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
        # dtype of activations and the KV cache (int8 linears keep fp32 activations)
        self.dtype = torch.float32 if self.kernels else hf_model.dtype
        int8 = int8 and self.kernels is not None and all(w % 32 == 0 for w in widths)
        # 8-bit activations: a --dtype gguf file's linears, or float weights onto that path (int8)
        self.int8_activations = int8 or (weights is not None and weights.int8_activations)

        def int8_linear(weight, bias):  # float weights onto the target's 8-bit path
            return head_linear(weight, self.kernels, bias, int8=True)

        linear = int8_linear if int8 else partial(FusedLinear, self.kernels) if self.kernels else Linear
        self.eps = cfg.rms_norm_eps
        self.max_length = max_length or getattr(cfg, "max_position_embeddings", 2048)
        if rope_type(cfg) == "longrope":  # Phi-3: its short factors hold up to the original context
            self.max_length = min(self.max_length, cfg.original_max_position_embeddings)
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
                    ACTIVATIONS[activation_name(cfg)],
                    offset,
                    kind,
                    cfg.sliding_window if kind == "sliding_attention" else None,
                    weights.layer(i, layer) if weights is not None else None,
                )
                for i, (layer, kind) in enumerate(zip(hf_model.model.layers, kinds))
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
        if weights is None:
            self.embedding = Embedding(hf_model.get_input_embeddings().weight)
            self.lm_head = linear(hf_model.get_output_embeddings().weight, None)
        else:  # after the layers: each layer's file pages are let go before the next (gguf_model.py)
            self.lm_head, self.embedding = weights.head(), weights.embedding()
            self._own_norms()
        self.vocab_size = self.lm_head.out_features
        self.k_cache = self.v_cache = None
        self.fused_rows = _FUSED_MAX_TOKENS  # longer forwards: SDPA and dense GEMMs (see rows_independent)
        self.stack = None  # the layers in one native call (backends/stack.py)
        if int8 or getattr(self.lm_head, "interleaved", False):  # every linear on the tiles
            self.rows_independent()
            self.stack = native_stack.build(self)
        self.reset()

    def _own_norms(self) -> None:
        """Norm weights of this model's own, not views of the skeleton's parameters (the native stack
        holds the tensors it is given)."""
        self.final_norm = self.final_norm.clone()
        for layer in self.layers:
            for name in ("norm1", "norm2", "post_attn_norm", "post_mlp_norm"):
                if getattr(layer, name) is not None:
                    setattr(layer, name, getattr(layer, name).clone())
            if layer.qk_norms is not None:
                layer.qk_norms = tuple(w.clone() for w in layer.qk_norms)

    def rows_independent(self) -> None:
        """Every forward through the fused kernels, whatever its length: for linears that give a row
        the same bits in any call (gguf on the tile kernels), so that a prompt's prefill, a verification
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
            where = ([0], [start], [n], native_stack.ONE_BLOCK)
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
        windows = {layer.window for layer in self.layers if layer.window}
        masks = {None: mask} | {w: window_mask(mask, positions, start + n, w) for w in windows}
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
        where = (
            torch.zeros(1, dtype=torch.long),
            torch.tensor([start]),
            torch.tensor([n]),
            native_stack.ONE_BLOCK,
        )  # slot 0
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
    place); k_cache, v_cache [layers, blocks, kv_heads, block, d]; ropes: rotary kind -> (cos, sin) [N, d];
    masks: window (None: full) -> [N, L] bool (row i sees key j of its slot where true), or None for
    causal rows; where: (slots, starts, counts) [B] long, sequence b's rows next in x, and the block
    table [slots, blocks a slot] long (attention_row.h's Layout); logit_rows: the
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

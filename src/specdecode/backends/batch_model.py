"""Many sequences in one target forward: the batched model behind the server.

`BatchedLlama` reuses a FastLlama's prepared layers (prepacked linears, cos/sin tables per rotary
kind, sliding windows, every family FastLlama covers) with a KV cache by the block (kv_pool.py: each
*slot* holds the blocks of its own tokens) and one length per slot; rolling a slot back is, as in
FastLlama, a change of its length (and the blocks past it go back to the pool). A forward takes ragged rows
(slot, tokens): the linear layers run on the rows' tokens packed together ([N, hidden], no
padding work), only attention scatters them into a right-padded [B, heads, S, head_dim] block
with a per-row causal mask over the row's own slot, at per-row RoPE positions. A row may be a token
tree (its own positions and tree mask, as CausalLM.forward), and may ask for the hidden rows of
some layers (Output.features), so one batch can verify trees and feed Medusa/EAGLE drafters.

`PerSlotLM` is the fallback for other architectures (HF forward): one single-sequence model
(HFModel, or any CausalLM) per slot, rows run one after another.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import torch
import torch.nn.functional as F

from specdecode.backends.fast_llama import FastLlama, fused_layers
from specdecode.backends.kv_pool import BLOCK, KVPool, row_bytes
from specdecode.backends.layer import rms_norm
from specdecode.backends.lm import CausalLM, Output, layer_ids
from specdecode.backends.models import HFModel
from specdecode.errors import UserError


@dataclass
class Row:
    slot: int
    tokens: torch.Tensor  # [n] new tokens for this slot, appended after its cached ones
    num_logits: int = 0  # return only the last num_logits rows of logits (0: all n)
    layers: tuple[int, ...] = ()  # hidden rows wanted for these layers (Output.features)
    positions: torch.Tensor | None = None  # [n] a token tree's rotary positions (None: consecutive)
    tree_mask: torch.Tensor | None = None  # [n, t] bool a token tree's mask over the slot's last t tokens


class BatchLM(Protocol):
    slots: int
    max_length: int
    vocab_size: int
    num_layers: int  # decoder layers (Row.layers' ids count them; -1 is the final norm's output)
    attention_span: float | None  # context tokens whose attention costs a token's matmuls; None: unknown
    shares_kv: bool  # slots' cache blocks can be held and shared (prefix caching: blocks_of, share)
    block: int  # positions a cache block holds
    block_bytes: int  # memory of one block
    capacity: int  # positions one slot could hold with the whole cache memory its own
    device: torch.device  # where its logits are (a request's generator lives there)

    def length(self, slot: int) -> int: ...

    def truncate(self, slot: int, length: int) -> None:
        """The slot keeps its first `length` positions (0: it is empty, its claim given back)."""
        ...

    def keep(self, slot: int, length: int, indices: list[int]) -> None:
        """As CausalLM.keep, for one slot (a tree's accepted path)."""
        ...

    def claim(self, slot: int, positions: int) -> bool:
        """Set cache memory aside for `slot` to hold `positions` -> whether there was enough."""
        ...

    def blocks_of(self, slot: int, end: int) -> list[int]:
        """The cache blocks holding positions [0, end) of a slot (shares_kv)."""
        ...

    def share(self, slot: int, blocks: list[int], length: int) -> None:
        """An empty slot starts with these blocks, holding `length` positions (a cached prefix)."""
        ...

    def hold(self, blocks: list[int]) -> None:
        """Someone beside the slots (the prefix cache) holds these blocks until unhold."""
        ...

    def unhold(self, blocks: list[int]) -> None: ...

    def cache_use(self) -> tuple[float, int]:
        """(share of the cache's blocks in use now, bytes of cache memory backed so far: its high-water
        mark); (0.0, 0) where the slots keep caches of their own."""
        ...

    def forward(self, rows: list[Row]) -> list[Output]:
        """rows -> one Output per row (logits [n_i or num_logits, V] float32, features [n_i, F]
        when asked); appends the tokens to each slot."""
        ...


def batched(
    model: CausalLM, slots: int, kv_memory: int | None = None, block: int = BLOCK, kv_dtype: str = "auto"
) -> BatchLM:
    """The batched form of a loaded target: BatchedLlama for FastLlama (its KV cache within
    `kv_memory` bytes, default kv_budget(), at `kv_dtype`: KV_DTYPES), PerSlotLM otherwise."""
    if isinstance(model, FastLlama):
        return BatchedLlama(model, slots, kv_memory, block, kv_dtype)
    return PerSlotLM([HFModel(model.hf) for _ in range(slots)])


def attention_span(cfg, heads: int, kv_heads: int, head_dim: int) -> float:
    """Context tokens whose attention (q·k and p·v, 4·heads·head_dim FLOPs a key) costs a prompt row
    as much as its layer's matmuls (2 FLOPs a weight): past this many cached tokens, attention is the
    larger part of a prefill chunk (SmolLM2-135M: 3,072)."""
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    weights = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    return weights / (2 * heads * head_dim)


# --kv-dtype: the KV cache's precision. auto: the model's own (float32 for gguf, as FastLlama's cache, so
# a batched row is the single-sequence loop's); fp16: half the memory, keys and values rounded to
# nearest (llama.cpp's default f16 cache); int8: 1.125 bytes a value, llama.cpp's q8_0 numbers (a scale
# a group of 32: kv_pool.q8_rows). Part of "the same target at the same precision".
KV_DTYPES = {"auto": None, "fp32": torch.float32, "fp16": torch.float16, "int8": torch.int8}


def kv_dtype_of(fast: FastLlama, kv_dtype: str) -> torch.dtype:
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"unknown KV cache dtype {kv_dtype!r}; one of {', '.join(KV_DTYPES)}")
    return KV_DTYPES[kv_dtype] or fast.dtype


def kv_bytes_per_token(fast: FastLlama, kv_dtype: str = "auto") -> int:
    """Keys and values of one position, every layer."""
    return 2 * len(fast.layers) * fast.kv_heads * row_bytes(fast.head_dim, kv_dtype_of(fast, kv_dtype))


def kv_budget(fast: FastLlama, slots: int, kv_dtype: str = "auto") -> int:
    """The default KV memory: every slot at the model's whole context, or half of the memory free
    now, whichever is less (the pool's pages are only backed as blocks are written: kv_pool.py)."""
    return min(slots * fast.max_length * kv_bytes_per_token(fast, kv_dtype), available_memory() // 2)


def available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (16 GiB where there is none)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 << 30


class BatchedLlama:
    shares_kv = True

    def __init__(
        self,
        fast: FastLlama,
        slots: int,
        kv_memory: int | None = None,
        block: int = BLOCK,
        kv_dtype: str = "auto",
    ):
        self.fast, self.slots = fast, slots
        self.attention_span = attention_span(fast.config, fast.heads, fast.kv_heads, fast.head_dim)
        self.max_length, self.vocab_size = fast.max_length, fast.vocab_size
        self.num_layers = len(fast.layers)
        self.device, self.dtype = fast.device, fast.dtype
        self.lengths = [0] * slots
        self.kv_memory = kv_budget(fast, slots, kv_dtype) if kv_memory is None else kv_memory
        self.block = block
        blocks = 1 + self.kv_memory // (block * kv_bytes_per_token(fast, kv_dtype))  # block 0: the zero block
        dims = (len(fast.layers), fast.kv_heads, fast.head_dim)
        self.pool = KVPool(
            dims, slots, self.max_length, blocks, kv_dtype_of(fast, kv_dtype), self.device, block
        )
        self.block_bytes = self.pool.block_bytes
        self.capacity = min(self.max_length, (blocks - 1) * block)

    @property
    def k_cache(self) -> torch.Tensor:
        """[layers, blocks, kv_heads, block, head_dim]"""
        return self.pool.k

    @property
    def v_cache(self) -> torch.Tensor:
        return self.pool.v

    def length(self, slot: int) -> int:
        return self.lengths[slot]

    def truncate(self, slot: int, length: int) -> None:
        self.lengths[slot] = min(self.lengths[slot], length)
        self.pool.trim(slot, self.lengths[slot])

    @torch.inference_mode()
    def keep(self, slot: int, length: int, indices: list[int]) -> None:
        m = len(indices)
        if indices != list(range(length, length + m)):
            self.pool.writable(slot, length, length + m)
            slots = torch.full((m,), slot, dtype=torch.long)
            src = self.pool.where(slots, torch.tensor(indices, dtype=torch.long))
            dst = self.pool.where(slots, torch.arange(length, length + m))
            for cache in (self.k_cache, self.v_cache):
                cache[:, dst[0], :, dst[1]] = cache[:, src[0], :, src[1]]  # gather copies first
        self.lengths[slot] = length + m
        self.pool.trim(slot, length + m)

    def claim(self, slot: int, positions: int) -> bool:
        return self.pool.claim(slot, positions)

    def blocks_of(self, slot: int, end: int) -> list[int]:
        return self.pool.blocks_of(slot, end)

    def share(self, slot: int, blocks: list[int], length: int) -> None:
        self.pool.share(slot, blocks)
        self.lengths[slot] = length

    def hold(self, blocks: list[int]) -> None:
        self.pool.hold(blocks)

    def unhold(self, blocks: list[int]) -> None:
        self.pool.unhold(blocks)

    def cache_use(self) -> tuple[float, int]:
        return self.pool.in_use() / (self.pool.blocks - 1), self.pool.backed_bytes()

    @torch.inference_mode()
    def forward(self, rows: list[Row]) -> list[Output]:
        f, at = self.fast, self._layout(rows)
        # chains as token ids: the native call gathers their rows, no torch ops (stack.cpp's forward_ids)
        if f.stack is not None and f.stack.by_ids and not at.trees:
            tokens = [t for r in rows for t in r.tokens.tolist()]
            where = (at.slots, at.starts, at.counts, self.pool.table)
            logits, captured = f.stack.chains(
                f, self.k_cache, self.v_cache, tokens, where, at.wanted, at.picked
            )
            return self._outputs(rows, at, logits, captured)
        x = f.embed_tokens(torch.cat([r.tokens for r in rows]))  # [N, hidden]
        fused = f.kernels is not None and len(x) <= f.fused_rows  # the fused kernels, as FastLlama's forward
        windows = {layer.window for layer in f.layers if layer.window}
        ix = _Index.of(at, self.device)
        if fused and not at.trees and not windows:  # causal rows: the kernels need no mask, only positions
            ropes = {kind: (cos[ix.pos], sin[ix.pos]) for kind, (cos, sin) in f.rope.items()}
            return self._fused(rows, at, x, ropes, {None: None})
        ropes, masks = self._ropes_masks(rows, at, ix, windows)
        if fused:
            per_row = {w: m[ix.row_of, 0, ix.t_of].contiguous() for w, m in masks.items()}  # [N, l_max]
            return self._fused(
                rows,
                at,
                x,
                ropes,
                {w: m if (w is not None or at.trees) else None for w, m in per_row.items()},
            )
        logits, captured = self._eager(rows, at, ix, x, ropes, masks)
        return self._outputs(rows, at, logits, captured)

    def _layout(self, rows: list[Row]) -> _Layout:
        counts = [r.tokens.shape[0] for r in rows]
        starts = [self.lengths[r.slot] for r in rows]
        ends = [s + n for s, n in zip(starts, counts)]
        if max(ends) > self.max_length:
            raise ValueError(f"sequence of {max(ends)} tokens exceeds max_length {self.max_length}")
        for r, start, end in zip(rows, starts, ends):  # blocks for the new tokens, claimed at admission
            self.pool.writable(r.slot, start, end)
        offsets = list(accumulate([0] + counts[:-1]))  # row b's tokens start at offsets[b]
        keep = [r.num_logits or n for r, n in zip(rows, counts)]  # rows with logits: each row's last `keep`
        picked = [i for o, n, m in zip(offsets, counts, keep) for i in range(o + n - m, o + n)]
        wanted = {i for r in rows for i in layer_ids(r.layers, len(self.fast.layers))}
        trees = any(r.tree_mask is not None for r in rows)
        return _Layout(counts, offsets, starts, ends, keep, picked, [r.slot for r in rows], wanted, trees)

    def _fused(self, rows: list[Row], at: _Layout, x, ropes, masks) -> list[Output]:
        """ropes, masks: as fused_layers takes them."""
        where = (torch.tensor(at.slots), torch.tensor(at.starts), torch.tensor(at.counts), self.pool.table)
        logits, captured = fused_layers(
            self.fast,
            x.float().contiguous(),
            self.k_cache,
            self.v_cache,
            ropes,
            masks,
            where,
            at.wanted,
            at.picked,
        )
        return self._outputs(rows, at, logits, captured)

    def _ropes_masks(self, rows: list[Row], at: _Layout, ix: _Index, windows: set[int]):
        """-> (rotary kind -> (cos, sin) [N, d], window (None: whole context) -> mask [B, 1, S, L]):
        query t of row b (position start_b + t) sees keys 0..start_b + t of its own slot; a tree's last
        t tokens see each other only as its mask says; a sliding-window layer's query at rotary
        position p sees no key before p - w + 1 (Gemma 3)."""
        f, dev = self.fast, self.device
        keys = torch.arange(max(at.ends), device=dev)
        queries = ix.start_t[:, None] + torch.arange(max(at.counts), device=dev)[None, :]  # [B, S]
        mask = keys[None, None, :] <= queries[:, :, None]
        rotary = ix.pos
        if at.trees:
            rotary = ix.pos.clone()
            for i, (r, o, n, end) in enumerate(zip(rows, at.offsets, at.counts, at.ends)):
                if r.tree_mask is not None:
                    rotary[o : o + n] = r.positions.to(dev)
                    mask[i, :n, end - r.tree_mask.shape[1] : end] = r.tree_mask.to(dev)
        ropes = {kind: (cos[rotary], sin[rotary]) for kind, (cos, sin) in f.rope.items()}
        masks = {None: mask[:, None]}
        if windows:
            qpos = torch.zeros(len(rows), max(at.counts), dtype=torch.long, device=dev)
            qpos[ix.row_of, ix.t_of] = rotary
            masks |= {w: (mask & (qpos[:, :, None] - keys[None, None, :] < w))[:, None] for w in windows}
        return ropes, masks

    def _eager(self, rows: list[Row], at: _Layout, ix: _Index, x, ropes, masks):
        """The layers in torch ops, rows in groups that share an attention call -> (logits [sum keep, V],
        {layer: its rows [N, hidden]})."""
        f, dev = self.fast, self.device
        h, d, kvh = f.heads, f.head_dim, f.kv_heads
        groups = [
            _Group(idx, at.counts, at.ends, at.slots, ix.row_of, ix.t_of, masks, dev)
            for idx in _attention_groups(at.counts, at.ends)
        ]
        for g in groups:  # a lone prefill chunk (no tree) on the CPU: two flash calls instead of a masked one
            (r,) = g.rows if len(g.rows) == 1 else (None,)
            if r is not None and at.counts[r] > SHORT_ROW and rows[r].tree_mask is None and dev.type == "cpu":
                g.chunk = (at.slots[r], at.starts[r], at.ends[r])
        block, offset = self.pool.where(torch.tensor(at.slots)[ix.row_of.cpu()], ix.pos)  # [N] each
        captured = {}
        for i, layer in enumerate(f.layers):
            q, k, v = layer.attention_inputs(x, *ropes[layer.rope_kind], h, kvh, f.eps)  # [N, h|kvh, d]
            self.pool.put(i, block, offset, k, v)  # [N, kvh, d] each into [blocks, kvh, block, row]
            out = q.new_empty(q.shape[0], h * d)
            for g in groups:
                out[g.tokens] = self._group_attention(g, i, layer.window, q)
            x = layer.finish(x, out, f.eps)
            if i in at.wanted:
                captured[i] = x
        last = len(f.layers) - 1
        if last in at.wanted:  # as HF's output_hidden_states: the last entry is after the final norm
            captured[last] = rms_norm(x, f.final_norm, f.eps)
        logits = f.lm_head(rms_norm(x[torch.tensor(at.picked, device=dev)], f.final_norm, f.eps)).float()
        return logits, captured

    def _group_attention(self, g: _Group, i: int, window: int | None, q: torch.Tensor) -> torch.Tensor:
        """Layer i's attention for the group's tokens: q [N, h, d] -> [n_g, h * d]."""
        f = self.fast
        h, d = f.heads, f.head_dim
        if g.chunk is not None and window is None:
            slot, start, end = g.chunk
            k, v = (t.to(q.dtype) for t in self.pool.gather(i, [slot], end))  # [1, kvh, end, d] each
            attn = chunk_attention(q[g.tokens].transpose(0, 1), k[0], v[0], start, f.qk_scale)  # [h, n, d]
            return attn.transpose(0, 1).reshape(-1, h * d)
        q_pad = q.new_zeros(len(g.rows), g.s, h, d)
        q_pad[g.row_of, g.t_of] = q[g.tokens]
        k, v = (t.to(q.dtype) for t in self.pool.gather(i, g.sel, g.l))  # [B_g, kvh, l, d] each
        attn = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),
            k,
            v,
            attn_mask=g.masks[window],
            enable_gqa=True,
            scale=f.qk_scale,
        )  # [B_g, h, S_g, d]
        return attn.transpose(1, 2)[g.row_of, g.t_of].reshape(-1, h * d)

    def _outputs(self, rows: list[Row], at: _Layout, logits, captured) -> list[Output]:
        """Each row's logits and features: logits [sum keep, V], row b's last keep[b] tokens'; captured:
        {layer: its rows [N, hidden]}."""
        f = self.fast
        for r, end in zip(rows, at.ends):
            self.lengths[r.slot] = end
        # each row's logits as a slice: Tensor.split's Python wrapper, cold after a forward, took 10% of
        # the server's engine thread (py-spy, one streaming client)
        outputs = []
        firsts = accumulate([0] + at.keep[:-1])  # row b's logits start at firsts[b]
        for r, o, n, first, m in zip(rows, at.offsets, at.counts, firsts, at.keep):
            ids = layer_ids(r.layers, len(f.layers))
            features = torch.cat([captured[i][o : o + n] for i in ids], -1) if ids else None
            outputs.append(Output(logits[first : first + m], features))
        return outputs


@dataclass(frozen=True)
class _Layout:
    """Where a forward's rows go: per row b its token count, first token in x, cache start and end,
    logits kept (its last keep[b] tokens'), slot; the picked tokens (logits), layers wanted, trees."""

    counts: list[int]
    offsets: list[int]
    starts: list[int]
    ends: list[int]
    keep: list[int]
    picked: list[int]
    slots: list[int]
    wanted: set[int]
    trees: bool


@dataclass(frozen=True)
class _Index:
    """The layout as tensors over the N tokens: row_of [N] (their row), t_of [N] (index in the row),
    pos [N] (cache positions), start_t [B]."""

    row_of: torch.Tensor
    t_of: torch.Tensor
    pos: torch.Tensor
    start_t: torch.Tensor

    @classmethod
    def of(cls, at: _Layout, dev) -> _Index:
        row_of = torch.repeat_interleave(torch.arange(len(at.counts)), torch.tensor(at.counts)).to(dev)
        t_of = torch.cat([torch.arange(n) for n in at.counts]).to(dev)
        start_t = torch.tensor(at.starts, device=dev)
        return cls(row_of, t_of, start_t[row_of] + t_of, start_t)


SHORT_ROW = 16  # rows of at most this many tokens (decoding, verification) share one attention call
SHORT_CONTEXT = 256  # ... when their contexts are alike (_attention_groups)


def chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float | None = None
) -> torch.Tensor:
    """Attention of a prefill chunk after `start` cached tokens (CPU): q [h, n, d] at positions
    start..start+n-1, k and v [kvh, start+n, d] -> [h, n, d]; each query sees every earlier key.

    The same as SDPA with a causal mask shifted by `start`, computed as two unmasked flash-attention
    calls merged by their log-sum-exp: the chunk over its own keys (causal) and, with each key head's
    query heads folded into one long query block, over the keys before it: faster than the masked call
    (docs/server.md), and at the end of a long prompt attention costs more than a chunk's linears."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    h, n, d = q.shape
    kvh = k.shape[0]
    groups = h // kvh
    own_k, own_v = (t[:, start:].repeat_interleave(groups, 0)[None] for t in (k, v))
    own, own_lse = flash(q[None], own_k, own_v, is_causal=True, scale=scale)  # [1, h, n, d], [1, h, n]
    if start == 0:
        return own[0]
    folded = q.reshape(kvh, groups * n, d)[None]  # query head kv * groups + j uses key head kv
    past, past_lse = flash(folded, k[None, :, :start], v[None, :, :start], scale=scale)
    past, past_lse = past.reshape(h, n, d), past_lse.reshape(h, n)
    top = torch.maximum(own_lse[0], past_lse)
    w_own, w_past = (own_lse[0] - top).exp()[..., None], (past_lse - top).exp()[..., None]
    return ((w_own * own[0].float() + w_past * past.float()) / (w_own + w_past)).to(q.dtype)


def _attention_groups(counts: list[int], ends: list[int]) -> list[list[int]]:
    """Rows in attention calls: each long one (a prefill chunk) alone, so that decode rows are not
    padded to a chunk's length (8 decode rows beside one 256-token chunk were padded to 256 queries
    each), and the short ones (decoding, verification) together in buckets of similar context
    length: a call pads every row's keys to its longest context, and one row decoding after a
    4,000-token prompt made 16 rows' attention gather and read 4,000 keys each (2.8 s a step
    instead of 0.23). A bucket takes rows up to twice its shortest context plus SHORT_CONTEXT."""
    short = sorted((i for i, n in enumerate(counts) if n <= SHORT_ROW), key=lambda i: ends[i])
    buckets: list[list[int]] = []
    for i in short:
        if buckets and ends[i] <= 2 * ends[buckets[-1][0]] + SHORT_CONTEXT:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets + [[i] for i, n in enumerate(counts) if n > SHORT_ROW]


class _Group:
    """One attention call's rows: their tokens in the flat batch, padded layout, cache slots and masks."""

    def __init__(self, rows, counts, ends, slot_ids, row_of, t_of, masks, dev):
        self.rows, self.s, self.l = rows, max(counts[i] for i in rows), max(ends[i] for i in rows)
        self.chunk: tuple[int, int, int] | None = (
            None  # (slot, start, end): a lone prefill chunk (chunk_attention)
        )
        local = torch.full((len(counts),), -1, dtype=torch.long)
        local[rows] = torch.arange(len(rows))
        local = local.to(dev)
        self.tokens = torch.nonzero(local[row_of] >= 0).flatten()  # [N_g] this group's tokens in the batch
        self.row_of, self.t_of = local[row_of[self.tokens]], t_of[self.tokens]
        self.sel = [slot_ids[i] for i in rows]
        index = torch.tensor(rows, device=dev)
        self.masks = {w: m[index, :, : self.s, : self.l] for w, m in masks.items()}  # [B_g, 1, S_g, L_g]


class PerSlotLM:
    """One CausalLM per slot (for a transformers model: HFModels, each with its own DynamicCache), rows
    in turn."""

    attention_span = None
    shares_kv = False
    block = block_bytes = 0

    def __init__(self, seqs: list[CausalLM]):
        self.seqs = seqs
        self.slots = len(seqs)
        self.max_length, self.vocab_size = self.seqs[0].max_length, self.seqs[0].vocab_size
        self.capacity = self.max_length  # each DynamicCache grows by itself
        self.device = self.seqs[0].device

    @property
    def num_layers(self) -> int:  # asked only by a capturing request (a table model has no layers)
        return self.seqs[0].hf.config.num_hidden_layers

    def length(self, slot: int) -> int:
        return self.seqs[slot].length

    def truncate(self, slot: int, length: int) -> None:
        seq = self.seqs[slot]
        if length == 0:
            seq.reset()
        else:
            seq.truncate(length)

    def keep(self, slot: int, length: int, indices: list[int]) -> None:
        self.seqs[slot].keep(length, indices)

    def claim(self, slot: int, positions: int) -> bool:
        return True  # each DynamicCache grows by itself

    def blocks_of(self, slot: int, end: int) -> list[int]:
        raise NotImplementedError("PerSlotLM shares no cache blocks (shares_kv is False)")

    def share(self, slot: int, blocks: list[int], length: int) -> None:
        raise NotImplementedError("PerSlotLM shares no cache blocks (shares_kv is False)")

    def hold(self, blocks: list[int]) -> None:
        raise NotImplementedError("PerSlotLM shares no cache blocks (shares_kv is False)")

    def unhold(self, blocks: list[int]) -> None:
        raise NotImplementedError("PerSlotLM shares no cache blocks (shares_kv is False)")

    def cache_use(self) -> tuple[float, int]:
        return 0.0, 0  # each DynamicCache grows by itself

    def forward(self, rows: list[Row]) -> list[Output]:
        return [
            self.seqs[r.slot].forward(
                r.tokens,
                num_logits=r.num_logits,
                layers=r.layers,
                positions=r.positions,
                tree_mask=r.tree_mask,
            )
            for r in rows
        ]

"""The EAGLE head's network (eagle.py drafts with it, train/eagle.py trains it, export/vllm.py writes it).

Per position j:  g = fuse([layer_a; layer_b; layer_c])  (target features; the head's own previous
output o at later draft steps), x = g + Attn(qkv([norm(embed(t_{j+1})); norm(g)])),
o = x + MLP(norm(x)), logits = lm_head[token_map] · norm(o). The embedding and the LM head are the
target's, frozen and not stored; the LM head is restricted to a draft vocabulary of frequent tokens,
which cuts its cost (it dominates a 135M model's draft step). The head keeps its own KV cache
(`KVCache`); rolling back is a change of length (as in fast_llama.py).

Beside a `--dtype gguf` target (any ISA: tile.h has a microkernel for each) the head's linears are
the target's interleaved 8-bit matrices, and a draft step (its layer and the draft vocabulary's
logits) is one call of the target's native stack (`NativeHead`, stack.cpp with a pair norm): in torch
it was ~30 ops, each starting cold after the target's forward has streamed its weights through the
caches.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.backends.embedding import Embedding
from specdecode.backends.gguf_weights import QuantLinear
from specdecode.backends.layer import rope
from specdecode.backends.lm import tree_attention
from specdecode.backends.stack import ONE_BLOCK, StackParams


def rope_tables(hf_model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, head_dim] from the target's own rotary module (same heads, same positions; with
    a table per layer kind, as Gemma 3 has, the global layers' one)."""
    rotary = hf_model.model.rotary_emb
    kind = ("full_attention",) if "layer_type" in inspect.signature(rotary.forward).parameters else ()
    device = next(rotary.buffers()).device  # a GGUF skeleton: weights on the meta device, buffers real
    with torch.no_grad():
        positions = torch.arange(n, device=device)[None]
        cos, sin = rotary(torch.empty(0, dtype=torch.float32, device=device), positions, *kind)
    return cos[0].float(), sin[0].float()


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


class EagleHead(nn.Module):
    def __init__(
        self,
        hidden: int,
        fused: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        intermediate: int,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.fuse = nn.Linear(fused, hidden, bias=False)
        self.norm_emb, self.norm_feat, self.norm_mlp, self.norm_out = (
            nn.Parameter(torch.ones(hidden)) for _ in range(4)
        )
        self.qkv = nn.Linear(2 * hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def _qkv(self, emb, feat, cos, sin):
        """emb, feat: [B, T, H]; cos, sin: [T, d] -> q [B, h, T, d], k and v [B, kvh, T, d]."""
        b, t, _ = emb.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        x = torch.cat([_norm(emb, self.norm_emb, self.eps), _norm(feat, self.norm_feat, self.eps)], -1)
        qkv = self.qkv(x).view(b, t, h + 2 * kvh, d).transpose(1, 2)
        q, k = rope(qkv[:, : h + kvh], cos, sin).split([h, kvh], dim=1)
        return q, k, qkv[:, h + kvh :]

    def _finish(self, feat, attn):
        """feat: [B, T, H] residual input, attn: [B, h, T, d] -> o [B, T, H]."""
        b, _, t, _ = attn.shape
        x = feat + self.o(attn.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(_norm(x, self.norm_mlp, self.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    def logits(self, o: torch.Tensor, project) -> torch.Tensor:
        """o: [..., H]; project: [..., H] -> [..., Vd], the LM head over the draft vocabulary."""
        return project(_norm(o, self.norm_out, self.eps))

    def step(self, emb, feat, cache: "KVCache", cos, sin, positions=None, tree_mask=None) -> torch.Tensor:
        """Inference: emb, feat [m, H] into cache slots cache.length.. -> o [m, H]; appends to the cache.
        By default the rows are consecutive positions, causally masked; a tree passes `positions` [m]
        and `tree_mask` [m, t] over the last t slots (each row sees every slot before those)."""
        start, m = cache.length, emb.shape[0]
        if positions is not None:
            cos, sin = cos[positions], sin[positions]
        else:
            cos, sin = cos[start : start + m], sin[start : start + m]
        q, k, v = self._qkv(emb[None], feat[None], cos, sin)
        keys, values = cache.append(k[0], v[0])
        if tree_mask is not None:
            mask = tree_attention(tree_mask.to(emb.device), start)
        else:
            mask = (
                torch.ones(m, start + m, dtype=torch.bool, device=emb.device).tril(start) if m > 1 else None
            )
        attn = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, enable_gqa=True)
        return self._finish(feat[None], attn)[0]

    def unroll(self, emb, fused, cos, sin, steps: int) -> list[torch.Tensor]:
        """Training with training-time test (EAGLE-3): emb [B, T, H] (embedding of token j+1 at row j),
        fused [B, T, F] -> [o_0, ..., o_{steps-1}], each [B, T, H]. Step s at row j stands for the
        (s+1)-th draft after committed position j - s: its feature input is o_{s-1} at row j - 1, and
        it attends to step-0 keys at rows <= j - s and to the key of step r at row j - s + r
        (r = 1..s), exactly the cache contents the drafter has at inference."""
        g = self.fuse(fused)
        outs, keys, values = [], [], []
        t, groups = emb.shape[1], self.heads // self.kv_heads
        scale = self.head_dim**-0.5
        for s in range(steps):
            feat = g if s == 0 else F.pad(outs[-1][:, :-1], (0, 0, 1, 0))
            q, k, v = self._qkv(emb, feat, cos, sin)
            keys.append(k.repeat_interleave(groups, 1))
            values.append(v.repeat_interleave(groups, 1))
            causal = torch.ones(t, t, dtype=torch.bool, device=emb.device).tril(-s)
            scores = [
                (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
            ]  # [B, h, T, T]
            rows = torch.arange(t, device=emb.device)
            for r in range(1, s + 1):
                shift = s - r  # key of step r sits `shift` rows before the query's row
                kr = F.pad(keys[r][:, :, : t - shift], (0, 0, shift, 0))
                diag = (q * kr).sum(-1, keepdim=True) * scale  # [B, h, T, 1]
                scores.append(diag.masked_fill((rows < shift)[:, None], float("-inf")))
            probs = torch.cat(scores, -1).softmax(-1)
            attn = probs[..., :t] @ values[0]
            for r in range(1, s + 1):
                shift = s - r
                vr = F.pad(values[r][:, :, : t - shift], (0, 0, shift, 0))
                attn = attn + probs[..., t + r - 1 : t + r] * vr
            outs.append(self._finish(feat, attn))
        return outs


class KVCache:
    """The head's keys and values [kv_heads, capacity, d]; rollback is `length = n`."""

    def __init__(self, kv_heads: int, head_dim: int, device, block: int = 256):
        self.kv_heads, self.head_dim, self.device, self.block = kv_heads, head_dim, device, block
        self.k = self.v = torch.zeros(kv_heads, 0, head_dim, device=device)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: [kvh, m, d] -> all keys and values so far [kvh, length, d]."""
        end = self.length + k.shape[1]
        self.reserve(end)
        self.k[:, self.length : end], self.v[:, self.length : end] = k, v
        self.length = end
        return self.k[:, :end], self.v[:, :end]

    def reserve(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Room for `end` positions -> all of k, v as one layer's one slot [1, 1, kvh, cap, d] (stack.cpp)."""
        if end > self.k.shape[1]:
            cap = -(-end // self.block) * self.block
            grow = torch.zeros(self.kv_heads, cap - self.k.shape[1], self.head_dim, device=self.device)
            self.k, self.v = torch.cat([self.k, grow], 1), torch.cat([self.v, grow], 1)
        return self.k[None, None], self.v[None, None]


class NativeHead:
    """The head's layer and its LM head over the draft vocabulary in one kernels.Stack call (a one-layer
    stack whose q|k|v read [norm_emb(embed(token)); norm_feat(feature)]): the target's 8-bit path, the
    embedding and rotary rows gathered natively. `build` returns None where a linear is not interleaved."""

    def __init__(self, head: EagleHead, project: QuantLinear, ops, embedding: Embedding, cos, sin):
        def weight(w: torch.Tensor) -> torch.Tensor:
            return w.detach().float().contiguous()

        self.stack = ops.Stack(
            StackParams(
                qkv=[head.qkv.linear.interleaved_parts()],
                o=[head.o.linear.interleaved_parts()],
                gate_up=[head.gate_up.linear.interleaved_parts()],
                down=[head.down.linear.interleaved_parts()],
                norm1=[weight(head.norm_feat)],
                norm2=[weight(head.norm_mlp)],
                final_norm=weight(head.norm_out),
                heads=head.heads,
                kv_heads=head.kv_heads,
                head_dim=head.head_dim,
                eps=head.eps,
                head=project.interleaved_parts(),
                pair_norm=weight(head.norm_emb),
            )
        )
        self.embedding, self.cos, self.sin = embedding, cos.contiguous(), sin.contiguous()

    @staticmethod
    def build(head: EagleHead, project, ops, embedding: Embedding, cos, sin) -> "NativeHead | None":
        linears = [head.qkv.linear, head.o.linear, head.gate_up.linear, head.down.linear, project]
        if not all(isinstance(lin, QuantLinear) and lin.interleaved_parts() for lin in linears):
            return None  # float linears (a float target): the torch path
        return NativeHead(head, project, ops, embedding, cos, sin)

    def chain(self, tokens: list[int], feat: torch.Tensor, cache: KVCache, logit_rows: list[int]):
        """tokens [m] target ids at the cache's next positions, feat [m, H] the features they continue
        (updated in place into the head's outputs o) -> logits [len(logit_rows), Vd]; appends to the cache."""
        m, start = len(tokens), cache.length
        k, v = cache.reserve(start + m)
        ids, embed = self.embedding.gathered(tokens)
        _, logits = self.stack.forward_ids(
            ids, [0], [start], [m], ONE_BLOCK, embed, k, v, [self.cos], [self.sin], [], logit_rows, feat
        )
        cache.length = start + m
        return logits

    def tree(self, tokens: list[int], feat: torch.Tensor, cache: KVCache, positions: list[int], mask):
        """As chain for a tree's frontier: token i at rotary position positions[i], seeing the slots of the
        last mask.shape[1] where mask [m, t] and every slot before -> logits [m, Vd] (all rows)."""
        m, start = len(tokens), cache.length
        k, v = cache.reserve(start + m)
        at = torch.tensor(positions)
        emb = self.embedding(torch.tensor(tokens)).float().contiguous()
        where = (torch.zeros(1, dtype=torch.long), torch.tensor([start]), torch.tensor([m]), ONE_BLOCK)
        _, logits = self.stack.forward(
            feat,
            k,
            v,
            [self.cos[at]],
            [self.sin[at]],
            [tree_attention(mask, start)],
            *where,
            [],
            list(range(m)),
            emb,
        )
        cache.length = start + m
        return logits


def head_from_config(config: dict) -> EagleHead:
    return EagleHead(
        config["hidden"],
        config["hidden"] * len(config["layers"]),
        config["heads"],
        config["kv_heads"],
        config["head_dim"],
        config["intermediate"],
        config["eps"],
    )

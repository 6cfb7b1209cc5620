"""`eagle[:DIR]`: an EAGLE-style feature-level draft head.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty")
drafts autoregressively at the feature level: one decoder layer takes the target's feature at
position t together with the embedding of the token at t + 1 and predicts the feature at t + 1,
whose LM-head output gives the token at t + 2. EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up
Inference Acceleration of Large Language Models via Training-Time Test") feeds a fusion of low,
mid and high target layers instead of the top one, drops the feature-regression loss, and trains
with "training-time test": later draft steps see the head's own outputs as features, as at
inference. The drafter proposes a chain (top-1 per depth), or with `b=B[:nodes=N]` EAGLE-2's dynamic
tree (Li et al. 2024; growth.py): the head runs once per depth on the B best nodes of the previous
depth, each node attending to its own ancestors in the head's cache (N defaults to B·k).

`window=W`: the head reads a long prompt's first SINK positions and its last W, not the middle (as
draft_lm.py's window, StreamingLLM's sinks; the positions kept sit one after another in the head's
cache). Its pass over the whole prompt is a cost each request pays before its first draft, inside
the time to its first token: +6% of it on an AVX2 Zen 5 at ~200-token prompts, and the head trains
on windows of 384 positions (`train eagle`'s window) and never attends further in training.

The head here, per position j:  g = fuse([layer_a; layer_b; layer_c])  (target features; the head's
own previous output o at later draft steps), x = g + Attn(qkv([norm(embed(t_{j+1})); norm(g)])),
o = x + MLP(norm(x)), logits = lm_head[token_map] · norm(o). The embedding and the LM head are the
target's, frozen and not stored; the LM head is restricted to a draft vocabulary of frequent tokens,
which cuts its cost (it dominates a 135M model's draft step). The head keeps its own KV cache;
rolling back is a change of length (as in fast_llama.py).

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
from specdecode.backends.layer import pack_linears, rope
from specdecode.backends.lm import tree_attention
from specdecode.backends.stack import ONE_BLOCK, StackParams
from specdecode.core.drafter import Drafter, Proposal
from specdecode.core.sampling import Warp, argmax_ids, sample, warp
from specdecode.core.tree import Tree
from specdecode.drafters.chain_stop import ChainStop
from specdecode.drafters.draft_lm import SINK
from specdecode.drafters.draft_vocab import scatter_probs
from specdecode.drafters.growth import Growth, draft_dist


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


class EagleDrafter(Drafter):
    name = "eagle"

    def __init__(
        self,
        head: EagleHead,
        token_map: torch.Tensor,
        target,
        layer_ids: tuple[int, ...],
        branches: int = 1,
        nodes: int | None = None,
        stop: float | ChainStop = 0.0,
        window: int | None = None,
    ):
        """target: the target's CausalLM; the decoder feeds this drafter the rows of its layers
        `layer_ids` (self.layers). branches > 1 proposes trees of `nodes` nodes (default branches * k).
        stop: keep a chain's tokens while the product of their head probabilities is at least this, or
        pays their rows (a ChainStop, chain_stop.py); 0: never stop. window:
        read a prompt longer than SINK + window through its first SINK and last `window` positions."""
        self.head = pack_linears(head.eval(), target.kernels, target.int8_activations).float()  # the norms
        self.branches, self.nodes, self.window = branches, nodes, window
        self.stop = ChainStop.of(stop)
        self.target = target
        self.layers = tuple(layer_ids)
        self.token_map = token_map.to(target.device)
        self.token_ids = token_map.tolist()  # draft index -> target id, without a tensor op a draft
        self.embedding = target.embedding
        self.project = target.head_rows(self.token_map)
        self.cos, self.sin = rope_tables(target.hf, target.max_length + 64)
        self.native = NativeHead.build(
            self.head, self.project, target.kernels, self.embedding, self.cos, self.sin
        )

    def begin(self, prompt):
        self.cache = KVCache(
            self.head.kv_heads, self.head.head_dim, self.target.device
        )  # a copy's own (server)
        self.fed = 0  # positions of the context the head has read (its cache holds fed - dropped)
        self.dropped = 0  # of them, the window's middle: not in the cache
        self.root = None  # the head's output [1, H] at the last fed position: the first draft's input
        self.root_logits = None  # its logits over the draft vocabulary [1, Vd]: the first draft's
        self.pending: list[torch.Tensor] = []  # target features [n, F] of positions fed.. (not yet fed)

    def feed(self, features):
        self.pending.append(features.float())

    @torch.inference_mode()
    def _sync(self, context: list[int]) -> bool:
        """Feed the head the target features it has not seen; True when it holds the whole context
        (its output at the last position, `root`, is the first draft's input)."""
        if self.pending:
            feats = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)
            if self.fed + len(feats) != len(context) - 1:  # the decoder always keeps them in step
                raise RuntimeError(
                    f"eagle: features for {self.fed + len(feats)} positions, context {len(context)}"
                )
            self.cache.length = self.fed - self.dropped  # drop the previous step's drafted positions
            tokens = context[self.fed + 1 :]
            if self.fed == 0 and self.window is not None and len(feats) > SINK + self.window:
                self.dropped = len(feats) - SINK - self.window  # rows j: feature j, token j + 1
                keep = torch.cat([feats[:SINK], feats[-self.window :]])
                feats, tokens = keep, tokens[:SINK] + tokens[-self.window :]
            logits, o = self._catch_up(tokens, self.head.fuse(feats))
            self.fed, self.pending, self.root, self.root_logits = len(context) - 1, [], o, logits
        elif self.root is None or self.fed != len(context) - 1:
            return False  # no target features for this context yet
        self.cache.length = self.fed - self.dropped  # drafting again for the same context redrafts
        return True

    @torch.inference_mode()
    def chain(self, context: list[int], k: int, pick) -> list[int]:
        """Draft up to k tokens (target ids), choosing each with pick(logits [Vd]) -> (draft index, its
        probability, its probability as known before the draw; the two None where no stop needs them);
        a token only while the chain's odds pay its row, the next only while they pay a head step and
        its row (`stop`, chain_stop.py)."""
        if not self._sync(context):
            return []
        drafted, logits, x, survive = [], self.root_logits, self.root, 1.0
        keep, go_on = self.stop.bars(k)
        for i in range(k):
            index, p, known = pick(logits[0])
            if self.stop.active:
                if survive * known < keep[i]:  # not worth its verification row
                    break
                survive *= p
            drafted.append(self.token_ids[index])
            if i == k - 1 or survive < go_on[i]:  # the next: not worth a head step and its row
                break
            logits, x = self._rows(drafted[-1:], x.clone())
        return drafted

    def _catch_up(self, tokens: list[int], feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over committed tokens [m] continuing the target's features feat [m, H], at the cache's
        next positions -> (the last row's logits [1, Vd], its output o [1, H]). Only the last row's
        output is drafted from: the others need only their keys and values, so they skip the attention
        output and the MLP (~60% of a row; on a 200-token prompt's 68-position window the pass took
        ~20 ms of an AVX2 request's first step)."""
        m, start = len(tokens), self.cache.length
        if m > 1:
            emb = self.embedding(torch.tensor(tokens[:-1], device=self.target.device)).float()
            at = slice(start, start + m - 1)
            _, k, v = self.head._qkv(
                emb[None], feat[None, :-1], self.cos[at], self.sin[at]
            )  # [1, kvh, m-1, d]
            self.cache.append(k[0], v[0])
        return self._rows(tokens[-1:], feat[-1:].clone(), last_only=True)

    def _rows(self, tokens: list[int], feat: torch.Tensor, positions=None, mask=None, last_only=False):
        """The head over tokens (target ids) [m] continuing the features feat [m, H] (consumed), at the
        cache's next positions, causal, or as a tree (positions [m], mask [m, t]: as EagleHead.step)
        -> (logits [m, Vd], or the last row's [1, Vd] with last_only; the head's outputs o [m, H])."""
        m = len(tokens)
        if self.native is not None:
            if mask is None:
                logits = self.native.chain(tokens, feat, self.cache, [m - 1] if last_only else list(range(m)))
            else:
                logits = self.native.tree(tokens, feat, self.cache, positions, mask)
            return logits, feat
        emb = self.embedding(torch.tensor(tokens, device=self.target.device)).float()
        at = None if positions is None else torch.tensor(positions, device=self.cos.device)
        o = self.head.step(emb, feat, self.cache, self.cos, self.sin, at, mask)
        return self.head.logits(o[-1:] if last_only else o, self.project), o

    @torch.inference_mode()
    def tree(self, context: list[int], k: int, params: Warp) -> Proposal:
        """EAGLE-2's dynamic tree of up to `nodes` nodes, at most k deep, over target ids; with a stop
        (stop=P or auto) it grows and keeps only the nodes that pay for themselves (growth.dynamic)."""
        if not self._sync(context):
            return Proposal.empty()
        growth, outputs = Growth(), {-1: self.root}  # node -> the head's output after it [1, H]

        def logq(logits: torch.Tensor) -> torch.Tensor:
            return draft_dist(logits, params).log()

        def children_logq(frontier: list[int]) -> torch.Tensor:
            positions = [self.fed - self.dropped - 1 + growth.depth[n] for n in frontier]
            tokens = [self.token_ids[growth.tokens[n]] for n in frontier]
            feat = torch.cat([outputs[growth.parents[n]] for n in frontier])
            logits, o = self._rows(tokens, feat, positions, growth.feed_mask(frontier))  # o [F, H]
            outputs.update((n, o[i : i + 1]) for i, n in enumerate(frontier))
            return logq(logits)

        tree, confidence = growth.dynamic(
            logq(self.root_logits)[0],
            k,
            self.branches,
            self.nodes or self.branches * k,
            children_logq,
            self.stop,
        )
        if not confidence:  # stop=auto: no node pays its row
            return Proposal.empty()
        return Proposal.of_tree(
            Tree([self.token_ids[t] for t in tree.tokens], tree.parents), confidence=confidence
        )

    def propose(self, context, k, params: Warp, generator):
        if self.branches > 1:
            return self.tree(context, k, params)
        if params.greedy:

            def top(logits):
                index = argmax_ids(logits)
                p = float(torch.softmax(logits.float(), -1)[index]) if self.stop.active else None
                return index, p, p  # the argmax is known before it is drawn

            tokens = self.chain(context, k, top)
            return Proposal(torch.tensor(tokens, dtype=torch.long))
        qs = []

        def pick(logits):
            qs.append(q := warp(logits, params))
            # a sampled token is kept on its expected probability, never on its own: lossless
            known = float(q.square().sum()) if self.stop.active else None
            index = sample(q, generator)
            return index, float(q[index]), known

        tokens = self.chain(context, k, pick)
        if not tokens:
            return Proposal.empty()
        q = scatter_probs(torch.stack(qs[: len(tokens)]), self.token_map, self.target.vocab_size)
        return Proposal(torch.tensor(tokens, dtype=torch.long), q)


class HeadSteps:
    """A drafter's head as draft_model.chain_costs times a draft model (fork, reset, extend): extend(n
    tokens) is the head over n positions of zero features in a cache of its own, the drafter's step."""

    def __init__(self, drafter: EagleDrafter):
        self.drafter = drafter

    def fork(self) -> "HeadSteps":
        return self

    def reset(self) -> None:
        self.drafter.begin([])

    @torch.inference_mode()
    def extend(self, tokens: torch.Tensor, num_logits: int = 0) -> torch.Tensor:
        hidden = len(self.drafter.head.norm_out)  # the head's width
        feat = torch.zeros(len(tokens), hidden, device=self.drafter.target.device)
        return self.drafter._rows(tokens.tolist(), feat)[0]


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


def load(
    spec: str | None, loaded, branches: int = 1, nodes: int | None = None, window: int | None = None
) -> EagleDrafter:
    """spec: a checkpoint directory from `specdecode train eagle`, or None for the shipped one."""
    from specdecode.backends import checkpoint
    from specdecode.backends.gguf_model import trim_heap

    tensors, config = checkpoint.load(spec, "eagle", loaded)
    with torch.device("meta"):  # no initial weights: the file's tensors are taken as they are
        head = head_from_config(config)
    head.load_state_dict({k: v for k, v in tensors.items() if k != "token_map"}, assign=True)
    drafter = EagleDrafter(
        head.to(loaded.model.device),
        tensors["token_map"].long(),
        loaded.model,
        tuple(config["layers"]),
        branches,
        nodes,
        window=window,
    )
    del tensors  # the file's tensors, now packed into the target's layout (the norms: float copies)
    trim_heap()  # with each linear's float copy freed as it was packed (1.5B's head: +105 MB resident)
    return drafter

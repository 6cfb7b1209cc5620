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

The head's network, its cache and its native step are eagle_head.py's.
"""

from __future__ import annotations

import torch

from specdecode.backends.layer import pack_linears
from specdecode.core.drafter import Drafter, Proposal
from specdecode.core.sampling import Warp, argmax_ids, sample, warp
from specdecode.core.tree import Tree
from specdecode.drafters.chain_stop import Calibration, ChainStop
from specdecode.drafters.draft_lm import SINK
from specdecode.drafters.draft_vocab import scatter_probs
from specdecode.drafters.eagle_head import EagleHead, KVCache, NativeHead, head_from_config, rope_tables
from specdecode.drafters.growth import Growth, draft_dist


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
        bits: int = 8,
    ):
        """target: the target's CausalLM; the decoder feeds this drafter the rows of its layers
        `layer_ids` (self.layers). branches > 1 proposes trees of `nodes` nodes (default branches * k).
        stop: keep a chain's tokens while the product of their head probabilities is at least this, or
        pays their rows (a ChainStop, chain_stop.py); 0: never stop. window:
        read a prompt longer than SINK + window through its first SINK and last `window` positions. bits:
        the head's linears beside a GGUF target at 8 or 4 bits a weight (layer.head_linear)."""
        self.head = pack_linears(head.eval(), target.kernels, target.int8_activations, bits).float()  # norms
        self.branches, self.nodes, self.window = branches, nodes, window
        self.calibrate = True  # the stop scales the head's odds by the request's record (Calibration)
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
        self.calibration = Calibration()  # this request's kept tokens over the head's stated odds

    def observe(self, drafted, accepted):
        self.calibration.observe(drafted, accepted)

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
        its row (`stop`, chain_stop.py), the odds scaled by this request's record (Calibration)."""
        if not self._sync(context):
            return []
        drafted, logits, x, survive = [], self.root_logits, self.root, 1.0
        keep, go_on = self.stop.bars(k)
        scale = self.calibration.scale if self.calibrate else float
        stated = self.calibration.chain()  # this chain's odds, as verification will judge them
        for i in range(k):
            index, p, known = pick(logits[0])
            if self.stop.active:
                if survive * scale(known) < keep[i]:  # not worth its verification row
                    break
                survive *= scale(p)
                stated.append(p)
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


def load(
    spec: str | None,
    loaded,
    branches: int = 1,
    nodes: int | None = None,
    window: int | None = None,
    bits: int = 8,
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
        bits=bits,
    )
    del tensors  # the file's tensors, now packed into the target's layout (the norms: float copies)
    trim_heap()  # with each linear's float copy freed as it was packed (1.5B's head: +105 MB resident)
    return drafter

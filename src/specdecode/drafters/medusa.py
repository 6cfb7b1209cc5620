"""`medusa[:DIR]`: Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads", Medusa-1: frozen target).

Head i (i = 1..K) reads the target's last hidden state h_t (after the final norm) at position t and
predicts the token at t + 1 + i (the target's own LM head predicts t + 1, which verification
supplies as the bonus token). Each head is one residual SiLU block, z = h + SiLU(W_i h + b_i)
(W_i starts at zero, so a fresh head copies the target), followed by the target's frozen LM head
restricted to a draft vocabulary (the most frequent target tokens): nothing of the 49k-row LM head is
stored with the heads.

Proposals are a chain, the top token of heads 1..k, or with `b=B[:nodes=N]` a token tree (Medusa's
tree attention): head d's B best tokens are the candidates at depth d whatever the path, and the N
nodes whose paths have the highest product of head probabilities are kept (growth.py; N defaults
to B·k). The drafter asks for the target's last hidden rows (`layers = (-1,)`) and keeps the
latest row the decoder feeds it: after prefill the last prompt row (the token before the last
committed one), after a verify step the last accepted token's row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdecode.backends.layer import head_linear
from specdecode.core.drafter import Drafter, Proposal
from specdecode.core.sampling import Warp, argmax, sample, warp
from specdecode.core.tree import Tree
from specdecode.drafters.draft_vocab import scatter_probs
from specdecode.drafters.growth import Growth, draft_dist


class MedusaHeads(nn.Module):
    def __init__(self, hidden: int, num_heads: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_heads, hidden, hidden))
        self.bias = nn.Parameter(torch.zeros(num_heads, hidden))

    @property
    def num_heads(self) -> int:
        return self.weight.shape[0]

    def forward(self, h: torch.Tensor, project, heads: int | None = None) -> torch.Tensor:
        """h: [N, H]; project: [..., H] -> [..., Vd], the LM head over the draft vocabulary
        -> logits [N, K, Vd] (first `heads` heads)."""
        w, b = self.weight[:heads], self.bias[:heads]
        z = h[:, None] + F.silu(torch.einsum("nh,kgh->nkg", h, w) + b)  # [N, K, H]
        return project(z)


class MedusaDrafter(Drafter):
    name = "medusa"
    layers = (-1,)  # the target's final hidden state (after the norm), fed to `feed`

    def __init__(
        self, heads: MedusaHeads, token_map: torch.Tensor, target, branches: int = 1, nodes: int | None = None
    ):
        """target: the target's CausalLM (its LM head, device and vocabulary);
        branches > 1 proposes trees of `nodes` nodes (default branches * k)."""
        self.heads = heads.eval()
        self.branches, self.nodes = branches, nodes
        self.target = target
        self.token_map = token_map.to(target.device)
        self.project = target.head_rows(self.token_map)
        # the heads' K [H, H] matrices as one [K H, H] linear on the target's path (head_linear)
        K, H = heads.weight.shape[:2]
        self.mix = head_linear(
            heads.weight.detach().reshape(K * H, H),
            target.kernels,
            heads.bias.detach().reshape(K * H),
            target.int8_activations,
        )
        self.h: torch.Tensor | None = None  # [H] the target's last hidden row of the committed context

    def begin(self, prompt):
        self.h = None

    def feed(self, features):
        self.h = features[-1]

    @torch.inference_mode()
    def candidates(self, k: int) -> torch.Tensor | None:
        """Logits [k', Vd] of heads 1..k' (k' = min(k, K)) over the draft vocabulary for the next
        tokens; top-b per row gives a Medusa token tree. None when no hidden state is known yet."""
        h = self.h
        if h is None or k <= 0:
            return None
        k = min(k, self.heads.num_heads)
        h = h.float()
        z = h + F.silu(self.mix(h[None]).view(-1, h.shape[-1])[:k])  # [k', H], as MedusaHeads.forward
        return self.project(z)

    def propose(self, context, k, params: Warp, generator):
        logits = self.candidates(k)
        if logits is None:
            return Proposal.empty()
        if self.branches > 1:
            logq = draft_dist(logits, params).log()  # [k', Vd]
            growth = Growth()
            tree, confidence = growth.dynamic(
                logq[0],
                len(logq),
                self.branches,
                self.nodes or self.branches * len(logq),
                lambda frontier: logq[growth.depth[frontier[0]]].expand(len(frontier), -1),
            )
            return Proposal.of_tree(
                Tree(self.token_map[tree.tokens].tolist(), tree.parents), confidence=confidence
            )
        if params.greedy:
            return Proposal(self.token_map[argmax(logits)].cpu())
        q = warp(logits, params)  # [k, Vd]
        picks = torch.tensor([sample(row, generator) for row in q], device=q.device)
        return Proposal(self.token_map[picks].cpu(), scatter_probs(q, self.token_map, self.target.vocab_size))


def load(spec: str | None, loaded, branches: int = 1, nodes: int | None = None) -> MedusaDrafter:
    """spec: a checkpoint directory from `specdecode train medusa`, or None for the shipped one."""
    from specdecode.backends import checkpoint

    tensors, config = checkpoint.load(spec, "medusa", loaded)
    heads = MedusaHeads(config["hidden"], config["num_heads"])
    heads.load_state_dict({"weight": tensors["weight"].float(), "bias": tensors["bias"].float()})
    return MedusaDrafter(
        heads.to(loaded.model.device), tensors["token_map"].long(), loaded.model, branches, nodes
    )

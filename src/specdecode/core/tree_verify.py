"""Verification of a token tree against the target, as pure functions (the tree form of verify.py;
the same vocabulary: p target, q draft, accepted / recovered / bonus tokens).

Both verifiers walk down from the root. At a node, the target's distribution for the next token
is row `node + 1` of p (the tree's +1 layout); a child whose token the target accepts becomes the
next node. The walk ends at a node where no child is accepted: one more token (recovered, or bonus
at a leaf) is taken from the target there. The accepted path plus that token are committed.

Greedy: follow the child equal to the target's argmax; the output is token-identical to plain greedy
decoding (a tree only offers more chances to match).

Sampling: multi-draft rejection sampling. At a node with children c_1..c_m tried in order, with
r_1 = p(. | node):
    accept c_j with probability min(1, r_j(x_j) / q_j(x_j)); otherwise r_{j+1} = norm(max(0, r_j - q_j));
if no child is accepted, draw the recovered token from r_{m+1}. Here q_j is the distribution c_j's
token x_j was drawn from *given the earlier siblings*:
- sampled independently from one or several drafts: q_j is that draft's q (SpecInfer's multi-step
  speculative sampling: Miao et al. 2023, "SpecInfer: Accelerating Large Language Model Serving with
  Tree-based Speculative Inference and Verification", Algorithm 2);
- sampled without replacement from q: q_j is q with the earlier siblings removed and renormalised
  (recursive rejection sampling: Jeon et al. 2024, "Recursive Speculative Decoding");
- chosen deterministically (n-gram lookup, top-b children, merged ensembles): q_j is one-hot, so
  x_j is accepted with probability r_j(x_j) and r_{j+1} is r_j with x_j removed and renormalised.
  This holds for any fixed distinct tokens, hence for tokens chosen in any way that does not look at
  the verifier's random draws; it is what `q = None` means.
By induction over the siblings, the token committed at the node is distributed as p(. | node); down
the accepted child the same argument applies to its own children, so the committed sequence is
distributed as the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdecode.core.sampling import argmax_ids, sample
from specdecode.core.tree import Tree
from specdecode.core.verify import check_ids, check_inputs


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # accepted node indices, root's child first
    next_token: int  # recovered token, or the bonus token when the path ends at a leaf

    @property
    def accepted(self) -> int:
        return len(self.path)


def verify_tree_greedy(tree: Tree, target_logits: torch.Tensor) -> TreeVerdict:
    """target_logits: [N+1, V] (+1 layout) -> the longest path that follows the target's argmax."""
    check_ids(tree.tokens, target_logits.shape[-1])
    choice = argmax_ids(target_logits)  # N+1
    path, node = [], -1
    while (child := tree.child(node, choice[node + 1])) is not None:
        path.append(child)
        node = child
    return TreeVerdict(path, choice[node + 1])


def verify_tree_rejection(
    tree: Tree,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> TreeVerdict:
    """draft_probs q: [N, V], row i the distribution node i was drawn from given its path and earlier
    siblings, or None (all nodes deterministic: one-hot); target_probs p: [N+1, V] (+1 layout).
    Consumes one uniform per child tried and one categorical draw at the end. A child whose q is 0
    is never accepted."""
    check_inputs(
        torch.as_tensor(tree.tokens, dtype=torch.long), target_probs.shape[-1], draft_probs, target_probs
    )
    path, node = [], -1
    while True:
        residual = target_probs[node + 1]
        for child in tree.children[node + 1]:
            x = tree.tokens[child]
            q = draft_probs[child] if draft_probs is not None else None
            q_x = float(q[x]) if q is not None else 1.0
            u = float(torch.rand((), generator=generator, device=target_probs.device))
            if q_x > 0 and u * q_x < float(residual[x]):
                path.append(child)
                node = child
                break
            residual = _residual(residual, q, x)
        else:
            return TreeVerdict(path, sample(residual, generator))


def _residual(r: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
    """norm(max(0, r - q)) after rejecting x ~ q; one-hot q (None) removes x."""
    if q is not None:
        out = (r - q).clamp_min(0)
    else:
        out = r.clone()
        out[x] = 0
    total = out.sum()
    # total == 0 only where rejection had probability zero (r <= q nowhere, or r all on x); guard rounding.
    return out / total if total > 0 else r

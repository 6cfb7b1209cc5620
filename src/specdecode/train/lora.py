"""Low-rank adaptation (LoRA, Hu et al. 2021) for fine-tuning a drafter on a domain.

`apply` wraps the chosen nn.Linear layers of a model in `LoRALinear` (the base weight frozen, a
trainable update B·A of rank r scaled by alpha/r; B starts at zero, so training starts from the
unchanged model) and freezes every other parameter. `merged_state_dict` folds the updates into
plain weights for export, so a fine-tuned drafter is an ordinary checkpoint and costs nothing
extra at inference; `merge` does the same in place.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from specdecode.errors import UserError

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base
        base.weight.requires_grad_(False)
        if base.bias is not None:
            base.bias.requires_grad_(False)
        self.scale = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def delta(self) -> torch.Tensor:
        """[out, in] the weight update this adapter adds."""
        return self.scale * self.lora_b @ self.lora_a

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return self.base(x) + self.scale * (x @ self.lora_a.T) @ self.lora_b.T


def apply(
    model: nn.Module, rank: int, alpha: float | None = None, names: tuple[str, ...] = LLAMA_LINEARS
) -> int:
    """Freeze `model` and wrap its Linear layers whose attribute name is in `names`; returns how
    many were wrapped."""
    if rank < 1:
        raise UserError(f"the LoRA rank must be at least 1, got {rank}")
    for p in model.parameters():
        p.requires_grad_(False)
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if name in names and isinstance(child, nn.Linear)
    ]
    for parent, name in targets:
        setattr(parent, name, LoRALinear(getattr(parent, name), rank, alpha or 2.0 * rank))
    return len(targets)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """model.state_dict() as if every LoRALinear were a plain Linear with its update folded in."""
    out = {}
    wrapped = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    for key, value in model.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        if owner in wrapped:  # the adapter's own factors: folded into base.weight below
            continue
        parent, _, base = owner.rpartition(".")
        if base == "base" and parent in wrapped:
            key = f"{parent}.{leaf}"
            if leaf == "weight":
                value = value + wrapped[parent].delta().detach()
        out[key] = value
    return out


def merge(model: nn.Module) -> None:
    """Replace every LoRALinear by a plain Linear with the update folded in (in place)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                with torch.no_grad():
                    child.base.weight += child.delta()
                setattr(parent, name, child.base)

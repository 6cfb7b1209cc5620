"""A draft vocabulary: the most frequent target tokens (a checkpoint's `token_map`), over which
trained heads (medusa.py, eagle.py) predict. Shared by those drafters, so neither imports the other.
"""

from __future__ import annotations

import torch

from specdecode.backends.fast_llama import head_linear


def draft_lm_head(target, token_map: torch.Tensor):
    """The target's LM-head rows of the draft vocabulary [Vd, H]: [..., H] -> [..., Vd]. As a 1-row
    product it dominates a head's draft step: on a quantized target (--dtype gguf, gguf-exact) those
    rows of its quantized LM head, a quarter of the bytes; with the fused kernels in bfloat16 (half);
    else prepacked float32. A draft's precision changes what it proposes, never what is accepted."""
    head = getattr(target, "lm_head", None)
    if hasattr(head, "rows"):
        return head.rows(token_map)
    return head_linear(target.hf.get_output_embeddings().weight.detach()[token_map].float(), kernels(target))


def kernels(target):
    """The target's fused CPU kernels (FastLlama.kernels), None where it has none (HF backend, CUDA)."""
    return getattr(target, "kernels", None)


def scatter_probs(q_draft: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k, Vd] probabilities over the draft vocabulary -> [k, V] over the target's."""
    return q_draft.new_zeros(q_draft.shape[0], vocab_size).index_copy_(1, token_map, q_draft)

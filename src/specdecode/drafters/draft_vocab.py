"""A draft vocabulary: the most frequent target tokens (a checkpoint's `token_map`), over which
trained heads (medusa.py, eagle.py) predict. Shared by those drafters, so neither imports the other.
"""

from __future__ import annotations

import torch

from specdecode.backends.fast_llama import Linear


def draft_lm_head(target, token_map: torch.Tensor):
    """The target's LM-head rows of the draft vocabulary [Vd, H]: [..., H] -> [..., Vd]. As a 1-row
    product it dominates a head's draft step: prepacked float32, or, on a quantized target
    (--dtype gguf, gguf-exact), those rows of its quantized LM head, a quarter of the bytes."""
    head = getattr(target, "lm_head", None)
    if hasattr(head, "rows"):
        return head.rows(token_map)
    return Linear(target.hf.get_output_embeddings().weight.detach()[token_map].float())


def scatter_probs(q_draft: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k, Vd] probabilities over the draft vocabulary -> [k, V] over the target's."""
    return q_draft.new_zeros(q_draft.shape[0], vocab_size).index_copy_(1, token_map, q_draft)

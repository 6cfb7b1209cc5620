"""A draft vocabulary: the most frequent target tokens (a checkpoint's `token_map`), over which
trained heads (medusa.py, eagle.py) predict through the target's own LM-head rows of those tokens
(CausalLM.head_rows). Shared by those drafters, so neither imports the other.
"""

from __future__ import annotations

import torch


def scatter_probs(q_draft: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k, Vd] probabilities over the draft vocabulary -> [k, V] over the target's."""
    return q_draft.new_zeros(q_draft.shape[0], vocab_size).index_copy_(1, token_map, q_draft)

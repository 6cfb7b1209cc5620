"""A draft vocabulary: the most frequent target tokens (a checkpoint's `token_map`, or a tokenizer's
first merges for `draft:vocab=N:<model>`), over which trained heads (medusa.py, eagle.py) and draft
models predict through the LM-head rows of those tokens (CausalLM.head_rows). Verification is
unchanged, so the output stays exact; a token outside the vocabulary is simply never drafted.
"""

from __future__ import annotations

import torch


def frequent_tokens(tokenizer, n: int, vocab_size: int) -> torch.Tensor:
    """-> ids [<= n + specials]: the n tokens a byte-level BPE tokenizer merged first, which are its
    lowest ids (merge order follows frequency in the tokenizer's training text: the ranking FR-Spec,
    Zhao et al. 2025, takes from a corpus), and its special tokens (EOS among them)."""
    specials = {i for i in tokenizer.all_special_ids if i < vocab_size}
    return torch.tensor(sorted(set(range(min(n, vocab_size))) | specials), dtype=torch.long)


def scatter_probs(q_draft: torch.Tensor, token_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[k, Vd] probabilities over the draft vocabulary -> [k, V] over the target's."""
    return q_draft.new_zeros(q_draft.shape[0], vocab_size).index_copy_(1, token_map, q_draft)

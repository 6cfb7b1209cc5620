"""`ngram`: prompt/output lookup. Match the last n tokens earlier in the context (n from max_n
down to min_n) and propose what followed the most recent match. No weights, one-hot q.
(The idea of prompt lookup decoding: Saxena 2023; vLLM's `ngram` proposer.)
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from specdecode.drafters.base import Proposal
from specdecode.errors import UserError


def lookup(context: np.ndarray, k: int, max_n: int, min_n: int) -> np.ndarray:
    """context: [L] -> up to k tokens that followed the latest earlier match of its last n tokens."""
    length = context.shape[0]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = sliding_window_view(context[: length - 1], n)  # [L-n, n], starts 0..L-n-1
        hits = np.flatnonzero((windows == context[length - n :]).all(axis=1))
        if hits.size:
            start = hits[-1] + n
            return context[start : start + k]
    return context[:0]


class NgramDrafter:
    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 2):
        if not 1 <= min_n <= max_n:
            raise UserError(f"ngram needs 1 <= min_n <= max_n, got min_n={min_n} max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n

    def begin(self, prompt):
        pass

    def propose(self, context, k, params, generator):
        found = lookup(np.asarray(context, dtype=np.int64), k, self.max_n, self.min_n)
        return Proposal(torch.from_numpy(found.copy()))

    def observe(self, drafted, accepted):
        pass

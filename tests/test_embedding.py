"""A GGUF file's embedding rows looked up through the row cache are the very values of dequantizing
them anew, in any order and repetition; the cache stays bounded and bad ids still fail by name."""

import numpy as np
import pytest
import torch

from specdecode.backends import embedding
from specdecode.backends.embedding import Embedding, FileBlocks
from specdecode.backends.gguf_repack import dequantized

V, H = 300, 64  # two Q8_0 blocks a row


def q8_0_rows(seed: int = 0) -> np.ndarray:
    """Raw Q8_0 rows [V, 2 * 34]: a float16 scale and 32 int8 quants a block."""
    rng = np.random.default_rng(seed)
    scales = rng.uniform(0.01, 0.1, (V, 2, 1)).astype(np.float16).view(np.uint8)  # [V, 2, 2]
    quants = rng.integers(-127, 128, (V, 2, 32), dtype=np.int8).view(np.uint8)
    return np.ascontiguousarray(np.concatenate([scales, quants], -1).reshape(V, 68))


def test_cached_rows_equal_fresh_dequantization_bounded_and_unaliased(monkeypatch):
    monkeypatch.setattr(embedding, "CACHED_ROWS", 16)
    raw = q8_0_rows()
    fresh = dequantized("Q8_0", raw, "t")  # [V, H]
    table = Embedding(FileBlocks("Q8_0", raw, "t", H))
    rng = np.random.default_rng(1)
    for _ in range(200):  # small lookups with repeats, within a call and across calls
        ids = rng.integers(0, 40, rng.integers(1, 9))
        got = table(torch.from_numpy(ids))
        assert torch.equal(got, fresh[ids])
        assert len(table.table.cache) <= 16
        got.add_(1.0)  # a caller writing into its rows leaves the cache's alone
    assert torch.equal(table(torch.tensor([3, 3, 7])), fresh[[3, 3, 7]])


def test_large_lookups_bypass_the_cache_and_bad_ids_are_named():
    raw = q8_0_rows(2)
    table = Embedding(FileBlocks("Q8_0", raw, "t", H))
    assert torch.equal(table.weight(), dequantized("Q8_0", raw, "t"))
    assert len(table.table.cache) == 0  # the whole table went past it
    assert table(torch.zeros(0, dtype=torch.long)).shape == (0, H)
    with pytest.raises(IndexError, match="token id 300 outside the vocabulary of 300"):
        table(torch.tensor([1, 300]))

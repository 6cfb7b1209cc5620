"""The token embedding: a table of float rows, or a GGUF file's own blocks, left in the file's mapping
and dequantized row by row when looked up, as llama.cpp's loader keeps it (Qwen2.5-1.5B's 151,936 x
1536 table: 0.93 GB as float32, 0.13 GB of Q4_K blocks, of which only the looked-up rows' pages are
ever resident).

A looked-up row is gguf_repack.repack of its blocks, dequantized: the very float32 values of the
`gguf` package's dequantization (gguf_model.repack_float goes through the same functions), so
`--dtype gguf-exact` keeps its bits.

Decoding looks up a handful of rows at a time (a step's tokens, a draft head's chain), and numpy's
dequantization costs ~0.3 ms a call whatever the count: on Zen 5 (AVX-512) a third of the 1.5B's EAGLE
drafting time and ~1.5% of a plain step. So the last CACHED_ROWS rows looked up a few at a time are
kept as floats (12 MB for the 1.5B; the same values, looked up again instead of dequantized again).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from specdecode.backends.gguf_repack import dequantized

CACHED_ROWS = 2048  # rows kept as floats (least recently looked up first out)
CACHED_CALL = 64  # lookups of at most this many rows go through the cache (a prompt's do not)


@dataclass
class FileBlocks:
    """A GGUF tensor as read (gguf_file.read): its type name and its rows of raw blocks [V, bytes]."""

    kind: str
    raw: np.ndarray
    name: str
    width: int  # H: values per row
    cache: OrderedDict = field(default_factory=OrderedDict, repr=False)  # id -> float32 row [H]
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # engines in two threads

    @property
    def shape(self) -> tuple[int, int]:
        return self.raw.shape[0], self.width

    def rows(self, index: np.ndarray) -> torch.Tensor:
        """-> float32 [len(index), H]; an id outside the table is an IndexError naming it."""
        bad = index[(index < 0) | (index >= len(self.raw))]
        if len(bad):
            raise IndexError(f"token id {bad[0]} outside the vocabulary of {len(self.raw)} ids")
        if len(index) > CACHED_CALL:
            return dequantized(self.kind, self.raw[index], self.name)
        ids = index.tolist()
        with self.lock:
            missing = sorted({i for i in ids if i not in self.cache})
            if missing:
                for i, row in zip(missing, dequantized(self.kind, self.raw[missing], self.name)):
                    self.cache[i] = row
            for i in ids:
                self.cache.move_to_end(i)
            out = torch.stack([self.cache[i] for i in ids]) if ids else torch.zeros(0, self.width)
            while len(self.cache) > CACHED_ROWS:
                self.cache.popitem(last=False)
        return out


class Embedding:
    """table: float [V, H] (rows looked up as stored), or FileBlocks (rows dequantized to float32)."""

    def __init__(self, table: torch.Tensor | FileBlocks):
        self.table = table
        self.blocks = isinstance(table, FileBlocks)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.table.shape)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [n] (long) -> their rows [n, H] (float32 from file blocks)."""
        if self.blocks:
            return self.table.rows(tokens.cpu().numpy())
        return F.embedding(tokens.to(self.table.device), self.table)

    def weight(self) -> torch.Tensor:
        """The whole table as floats [V, H] (trainers, exports; file blocks are dequantized)."""
        return self(torch.arange(self.shape[0])) if self.blocks else self.table

    def gathered(self, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
        """For a native call that gathers rows by id from a contiguous float32 table: (ids, table),
        where the table is this one (ids = tokens) when it is such a table, else the looked-up rows
        themselves [n, H] (ids = 0..n-1)."""
        if not self.blocks and self.table.dtype == torch.float32 and self.table.is_contiguous():
            return tokens, self.table
        rows = self(torch.tensor(tokens, dtype=torch.long)).float().contiguous()
        return list(range(len(tokens))), rows

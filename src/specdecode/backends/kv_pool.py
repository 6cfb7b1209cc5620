"""The batched model's KV cache by the block: each slot holds the blocks of its own tokens.

Keys and values live in one pool, [layers, blocks, kv_heads, block, row] each (row: head_dim values, or
an int8 cache's head_dim bytes and their scales: row_width); a slot's position t
is in block table[slot, t // block] at offset t % block (vLLM's PagedAttention layout, Kwon et al.
2023, with the block's positions of one kv head contiguous, so attention reads a block's keys in a row).
Why: one capacity for every slot made one long prompt cost every slot its length (issue 57: a
5,384-token prompt on the 135M took 4.07 GB, 12x llama.cpp's), and growing that block copied all of
it. Here a slot pays for its own tokens, rounded up to a block, and nothing is ever copied to grow.

The pool is allocated once, for the memory budget, and never grown: the operating system backs its
pages on first write, so memory in use follows the blocks written (the lowest free block goes first),
not the budget. Block 0 stays zero and unowned: the table's unused entries point at it, so a padded
read (the eager attention's gathers) sees finite values, never garbage: a block is zeroed the first
time it is handed out (what it holds later is keys and values, finite), as masked keys weigh an exact
0 and 0 * NaN would not be 0.

Blocks are counted by reference: the prefix cache holds the blocks of a stored prompt, and a later
prompt that starts alike takes them into its table instead of copying (`share`). A block with more
than one holder is copied to a fresh one before a write lands in it (`writable`). Blocks are claimed
ahead of the writes (`claim`): admission claims a prompt and its next tokens, and before each step the
batched core tops the claims up, preempting the last admitted where the pool runs short
(decoding/batch_decoder.py: reserve), so a write never finds the pool empty; a request that could
never fit alone is refused.
"""

from __future__ import annotations

import heapq

import torch

from specdecode.errors import UserError

BLOCK = 64  # positions a block holds: a 5k-token prompt wastes under 1.3% in its last block
Q8_GROUP = 32  # an int8 cache row's values a scale (attention_row.h's Cache::Q8: llama.cpp's q8_0 numbers)


class KVMemoryFull(UserError):
    """The pool has no unclaimed block for a write that was not claimed ahead."""


def blocks_for(positions: int, block: int = BLOCK) -> int:
    return -(-positions // block)


def row_width(d: int, dtype: torch.dtype) -> int:
    """Elements a cache row of a d-wide head takes: d, or for int8 d bytes and d / 32 float scales."""
    return d + d // Q8_GROUP * 4 if dtype == torch.int8 else d


def row_bytes(d: int, dtype: torch.dtype) -> int:
    return row_width(d, dtype) * dtype.itemsize


def q8_rows(x: torch.Tensor) -> torch.Tensor:
    """[..., d] floats -> int8 cache rows [..., d + d / 8]: per group of 32, scale = max |x| / 127 and
    q = x / scale rounded to nearest even (0 where the group is 0), then the scales' bytes: the bits
    attention_row.h's q8_row writes."""
    g = x.float().unflatten(-1, (-1, Q8_GROUP))
    scale = g.abs().amax(-1) / 127
    q = torch.where(scale[..., None] > 0, torch.round(g / scale[..., None]), 0.0).to(torch.int8)
    return torch.cat([q.flatten(-2), scale.contiguous().view(torch.int8)], -1)


def q8_values(rows: torch.Tensor, d: int) -> torch.Tensor:
    """int8 cache rows [..., d + d / 8] -> their values [..., d] float32, exactly as attention reads them."""
    scale = rows[..., d:].contiguous().view(torch.float32)
    return (rows[..., :d].float().unflatten(-1, (-1, Q8_GROUP)) * scale[..., None]).flatten(-2)


class KVPool:
    def __init__(
        self, dims: tuple[int, int, int], slots: int, max_length: int, blocks: int, dtype, device, block=BLOCK
    ):
        """dims: (layers, kv_heads, head_dim); blocks: the pool's size, block 0 included; block:
        positions a block holds."""
        if blocks < 2:
            raise UserError(
                f"the KV cache needs at least 2 blocks of {block} positions, got {blocks} (--kv-memory)"
            )
        layers, kv_heads, d = dims
        if dtype == torch.int8 and d % Q8_GROUP:
            raise UserError(
                f"an int8 KV cache takes heads a multiple of {Q8_GROUP} wide; this model's are {d}"
            )
        self.d, self.quantized = d, dtype == torch.int8
        shape = (layers, blocks, kv_heads, block, row_width(d, dtype))
        self.k = torch.empty(shape, dtype=dtype, device=device)  # untouched: no memory until written
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.k[:, 0].zero_()
        self.v[:, 0].zero_()
        self.blocks, self.max_length, self.block = blocks, max_length, block
        self.table = torch.zeros(
            slots, blocks_for(max_length, block), dtype=torch.long
        )  # [slots, blocks a slot]
        self.owned: list[list[int]] = [[] for _ in range(slots)]  # each slot's blocks, in position order
        self.refs = [0] * blocks
        self.free = list(range(1, blocks))  # a heap: the lowest block goes first, so memory in use stays low
        self.claims = [0] * slots  # blocks set aside for a slot beyond those it owns
        self.zeroed = 1  # blocks below this were zeroed once (handed out lowest first)

    @property
    def block_bytes(self) -> int:
        """Keys and values of one block, every layer."""
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    def unclaimed(self) -> int:
        """Free blocks no slot has claimed."""
        return len(self.free) - sum(self.claims)

    def claim(self, slot: int, positions: int) -> bool:
        """Set aside blocks for `slot` to hold `positions` (with what it owns) -> whether they were
        there; claimed blocks are still free, only promised."""
        more = max(
            0, self._blocks(min(positions, self.max_length)) - len(self.owned[slot]) - self.claims[slot]
        )
        if more > self.unclaimed():
            return False
        self.claims[slot] += more
        return True

    def ensure(self, slot: int, end: int) -> None:
        """Blocks for positions [0, end) of `slot`: its claim first, then unclaimed ones."""
        owned = self.owned[slot]
        while len(owned) * self.block < end:
            self._own(slot, self._take(slot))

    def writable(self, slot: int, start: int, end: int) -> None:
        """Positions [start, end) of `slot` may be written: its blocks there become its own (a shared
        one is copied first)."""
        self.ensure(slot, end)
        for i in range(start // self.block, self._blocks(end)):
            block = self.owned[slot][i]
            if self.refs[block] > 1:
                fresh = self._take(slot)
                self.k[:, fresh] = self.k[:, block]
                self.v[:, fresh] = self.v[:, block]
                self.refs[block] -= 1
                self.refs[fresh] = 1
                self.owned[slot][i] = fresh
                self.table[slot, i] = fresh

    def trim(self, slot: int, length: int) -> None:
        """`slot` keeps positions [0, length): the blocks past them go back (to the free list when no
        one else holds them); at length 0 its claim goes too."""
        owned = self.owned[slot]
        while len(owned) > self._blocks(length):
            self.table[slot, len(owned) - 1] = 0
            self._drop(owned.pop())
        if length == 0:
            self.claims[slot] = 0

    def share(self, slot: int, blocks: list[int]) -> None:
        """An empty `slot` starts with these whole blocks (a cached prefix), held, not copied."""
        assert not self.owned[slot], "share() starts an empty slot"
        for block in blocks:
            self.refs[block] += 1
            self._place(slot, block)
        self.claims[slot] = max(0, self.claims[slot] - len(blocks))

    def hold(self, blocks: list[int]) -> None:
        """Someone other than a slot (the prefix cache) holds these blocks too."""
        for block in blocks:
            self.refs[block] += 1

    def unhold(self, blocks: list[int]) -> None:
        for block in blocks:
            self._drop(block)

    def blocks_of(self, slot: int, end: int) -> list[int]:
        """The blocks holding positions [0, end) of `slot`."""
        return self.owned[slot][: self._blocks(end)]

    def in_use(self) -> int:
        """Blocks owned or held (not free)."""
        return self.blocks - 1 - len(self.free)

    def backed_bytes(self) -> int:
        """Memory of the blocks handed out at least once (block 0 included): their pages were written,
        so they stay resident, whether their blocks are in use now or not."""
        return self.zeroed * self.block_bytes

    # -- reads and writes for the torch paths (the native kernels read through `table` themselves) --

    def gather(self, layer: int, slots, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions [0, end) of `slots` (a list or slice of slot ids), as one
        contiguous block: each [len(slots), kv_heads, end, d] (positions a slot has no block for: 0;
        an int8 cache's rows as float32 values)."""
        n = self._blocks(end)
        rows = self.table[slots, :n].to(self.k.device)  # [B, n]
        out = []
        for cache in (self.k[layer], self.v[layer]):
            kv = cache[rows]  # [B, n, kv_heads, block, row]
            b, _, h, _, w = kv.shape
            kv = kv.permute(0, 2, 1, 3, 4).reshape(b, h, n * self.block, w)[:, :, :end]
            out.append(q8_values(kv, self.d) if self.quantized else kv)
        return out[0], out[1]

    def put(
        self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Keys and values [N, kv_heads, d] into positions (blocks, offsets) [N] of `layer` (stored at
        the cache's precision: float16 rounded to nearest, int8 by q8_rows)."""
        for cache, x in ((self.k[layer], k), (self.v[layer], v)):
            cache[blocks, :, offsets] = q8_rows(x) if self.quantized else x.to(cache.dtype)

    def where(self, slots: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots, positions [N] -> (block, offset) [N] of each position."""
        blocks = self.table[slots.cpu(), positions.cpu() // self.block].to(positions.device)
        return blocks, positions % self.block

    def _blocks(self, positions: int) -> int:
        return blocks_for(positions, self.block)

    def _take(self, slot: int) -> int:
        """A free block for `slot`: one of its claim, else an unclaimed one (KVMemoryFull: none)."""
        if self.claims[slot]:
            self.claims[slot] -= 1
        elif self.unclaimed() < 1:
            raise KVMemoryFull(
                f"the KV cache's {self.blocks - 1} blocks of {self.block} positions are all in use "
                f"({self.block_bytes * (self.blocks - 1) >> 20} MiB, --kv-memory)"
            )
        return self._pop()

    def _pop(self) -> int:
        """The lowest free block, zeroed if it was never handed out."""
        block = heapq.heappop(self.free)
        if block >= self.zeroed:
            self.k[:, self.zeroed : block + 1].zero_()
            self.v[:, self.zeroed : block + 1].zero_()
            self.zeroed = block + 1
        return block

    def _own(self, slot: int, block: int) -> None:
        self.refs[block] = 1
        self._place(slot, block)

    def _place(self, slot: int, block: int) -> None:
        self.table[slot, len(self.owned[slot])] = block
        self.owned[slot].append(block)

    def _drop(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            heapq.heappush(self.free, block)

"""The batched model's KV cache, grown without stopping the streams that decode from it.

Keys and values are [layers, slots, kv_heads, capacity, head_dim], one capacity for every slot (so
attention reads a batch of slots as one strided block). Growing it means new, larger tensors and a
copy of every slot: with 17 slots of SmolLM2-135M, 4,352 positions are 3.4 GB to allocate, zero and
fill, and done at once when a long prompt was admitted it stalled every running stream for seconds
(issue 38: the streams' p99 gap between chunks 8.4x their median).

So growth goes *ahead*: `grow_ahead(positions)` allocates the larger tensors (untouched memory, no
copy yet) and each later `advance()` (once per batched forward) moves pieces (one layer of one slot)
into them, at most MIGRATE_BYTES of new cache a forward (at least one piece), while the forward keeps
reading and writing the old tensors. When the last piece is in, the positions written since the
migration began are copied once more and the new tensors take over. (Whole layers were the first
unit: one layer of 17 slots at 4,352 positions is 113 MB, first-touched and filled in one forward,
and kept the streams' p99 gap 9x their median while a 4k-token prompt was admitted; with the cache
reserved up front the same run gave 4.4x.) Only the sequence that asked for the room waits
for it (the decoder gives a prompt chunks up to `capacity`); the others do not notice. `ensure` grows
at once, as before: a reservation at start-up, or a forward that cannot wait.

Invariant that makes the final copy small and exact: every write to a slot lands at or after the
slot's length at that moment (a forward appends; rollback truncates; a tree's kept path moves down to
the length it was truncated to; prefix caching writes from the slot's length). The owner reports
each lowered length (`wrote_from`), so positions below the lowest length a slot had since the
migration began were never written during it, and were copied right.
"""

from __future__ import annotations

import torch

from specdecode.backends.layer import CACHE_BLOCK, grow_kv

MIGRATE_BYTES = 16 << 20  # new cache moved into place per forward while growing (keys and values)


class _Migration:
    """Larger tensors being filled layer by layer; `low[s]`: slot s's lowest length since it began."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, lengths: list[int]):
        self.k, self.v, self.pieces_done, self.low = k, v, 0, list(lengths)  # piece: (layer, slot)


class SlotCache:
    def __init__(
        self, dims: tuple[int, int, int, int], max_length: int, dtype, device, step_bytes=MIGRATE_BYTES
    ):
        """dims: (layers, slots, kv_heads, head_dim); step_bytes: new cache moved per advance()."""
        self.dims, self.max_length, self.dtype, self.device = dims, max_length, dtype, device
        self.step_bytes = step_bytes
        self.k: torch.Tensor | None = None  # [layers, slots, kv_heads, capacity, head_dim]
        self.v: torch.Tensor | None = None
        self.moving: _Migration | None = None
        self.wanted = 0  # asked for while a migration was under way: the next one's size

    @property
    def capacity(self) -> int:
        """Positions every slot can hold now (while growing: the old tensors')."""
        return 0 if self.k is None else self.k.shape[3]

    def ensure(self, needed: int, lengths: list[int]) -> None:
        """Room for `needed` positions now: a migration under way is finished, then the tensors grow at
        once if they must (copying every slot)."""
        if needed <= self.capacity:
            return
        if self.moving is not None:
            self._complete(lengths, self.pieces())
        self.k, self.v = grow_kv(self.k, self.v, needed, self.max_length, self.dims, self.dtype, self.device)

    def grow_ahead(self, needed: int, lengths: list[int]) -> None:
        """Room for `needed` positions over the next forwards (advance), without pausing them."""
        needed = min(needed, self.max_length)
        if needed <= self.capacity:
            return
        if self.k is None:  # nothing to copy yet: allocating is all there is
            self.ensure(needed, lengths)
        elif self.moving is not None:
            self.wanted = max(self.wanted, needed)
        else:
            size = min(self.max_length, -(-max(needed, 2 * self.capacity) // CACHE_BLOCK) * CACHE_BLOCK)
            layers, slots, kv_heads, d = self.dims
            shape = (layers, slots, kv_heads, size, d)
            make = dict(dtype=self.dtype, device=self.device)
            self.moving = _Migration(torch.empty(shape, **make), torch.empty(shape, **make), lengths)

    def wrote_from(self, slot: int, position: int) -> None:
        """The owner may now write `slot` from `position` on (its length went down to it)."""
        if self.moving is not None:
            self.moving.low[slot] = min(self.moving.low[slot], position)

    def pieces(self) -> int:
        """Pieces of a migration: one layer of one slot each."""
        return self.dims[0] * self.dims[1]

    def advance(self, lengths: list[int]) -> None:
        """One forward's share of a migration: pieces up to step_bytes; the swap after the last."""
        if self.moving is not None:
            piece_bytes = 2 * self.moving.k[0, 0].numel() * self.moving.k.element_size()
            self._complete(lengths, max(1, self.step_bytes // piece_bytes))

    def _complete(self, lengths: list[int], pieces: int) -> None:
        """Migrate up to `pieces` more pieces; after the last, swap and start the growth asked for since."""
        m = self.moving
        for _ in range(min(pieces, self.pieces() - m.pieces_done)):
            self._migrate_piece()
        if m.pieces_done == self.pieces():
            self._swap(lengths)
            wanted, self.wanted = self.wanted, 0
            self.grow_ahead(wanted, lengths)

    def _migrate_piece(self) -> None:
        """Copy the next (layer, slot) into the new tensors and zero the rest of its positions."""
        m, have = self.moving, self.capacity
        i, slot = divmod(m.pieces_done, self.dims[1])
        for new, old in ((m.k, self.k), (m.v, self.v)):
            new[i, slot, :, :have] = old[i, slot]
            new[i, slot, :, have:].zero_()  # masked positions are read (times 0): no garbage, no NaN
        m.pieces_done += 1

    def _swap(self, lengths: list[int]) -> None:
        """Every piece is in: re-copy what was written since the migration began, then switch."""
        m = self.moving
        for slot, (low, length) in enumerate(zip(m.low, lengths)):
            if low < length:
                m.k[:, slot, :, low:length] = self.k[:, slot, :, low:length]
                m.v[:, slot, :, low:length] = self.v[:, slot, :, low:length]
        self.k, self.v, self.moving = m.k, m.v, None

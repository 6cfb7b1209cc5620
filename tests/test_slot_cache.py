"""The batched model's KV cache grows ahead without losing a write: while pieces (one layer of one slot)
move into the larger tensors, the owner keeps appending and rolling back in the old ones, and after the
swap every slot holds exactly what it would have held in a cache that had always been large enough."""

import torch

from specdecode.backends.slot_cache import SlotCache

DIMS = (5, 3, 2, 4)  # layers, slots, kv_heads, head_dim


class Owner:
    """What BatchedLlama does to its cache, mirrored into a reference that never grows."""

    def __init__(self, cache: SlotCache, seed: int = 0):
        layers, slots, kv_heads, d = DIMS
        self.cache, self.lengths = cache, [0] * slots
        self.ref = torch.zeros(layers, slots, kv_heads, cache.max_length, d)
        self.g = torch.Generator().manual_seed(seed)

    def append(self, slot: int, n: int) -> None:  # a forward's rows for this slot
        a = self.lengths[slot]
        self.cache.ensure(a + n, self.lengths)
        values = torch.randn(DIMS[0], DIMS[2], n, DIMS[3], generator=self.g)
        self.cache.k[:, slot, :, a : a + n], self.cache.v[:, slot, :, a : a + n] = values, -values
        self.ref[:, slot, :, a : a + n] = values
        self.lengths[slot] = a + n

    def truncate(self, slot: int, length: int) -> None:  # rejected drafts
        self.lengths[slot] = min(self.lengths[slot], length)
        self.cache.wrote_from(slot, self.lengths[slot])

    def assert_intact(self) -> None:
        for slot, n in enumerate(self.lengths):
            assert torch.equal(self.cache.k[:, slot, :, :n], self.ref[:, slot, :, :n]), slot
            assert torch.equal(self.cache.v[:, slot, :, :n], -self.ref[:, slot, :, :n]), slot


def _cache(step_bytes: int = 1) -> SlotCache:
    return SlotCache(DIMS, 2048, torch.float32, torch.device("cpu"), step_bytes=step_bytes)


def test_growing_ahead_moves_a_piece_a_step_and_keeps_every_write_made_meanwhile():
    owner = Owner(_cache())
    for slot, n in enumerate((40, 10, 60)):
        owner.append(slot, n)
    cache = owner.cache
    assert cache.capacity == 256
    cache.grow_ahead(300, owner.lengths)
    old = cache.k
    steps = 0
    while cache.moving is not None:  # each step: one slot rolls back below where it was, all append
        owner.truncate(steps % 3, owner.lengths[steps % 3] - 5)
        for slot in range(3):
            owner.append(slot, 2)
        assert cache.k is old and cache.capacity == 256  # the forward keeps the old tensors meanwhile
        cache.advance(owner.lengths)
        steps += 1
    assert (
        steps == DIMS[0] * DIMS[1] and cache.capacity == 512
    )  # a piece a step; 2x, in CACHE_BLOCK multiples
    owner.assert_intact()
    assert (
        not cache.k[:, :, :, 256:].any() and not cache.v[:, :, :, 256:].any()
    )  # new room: zeros, no garbage


def test_a_forward_that_cannot_wait_finishes_the_move_and_a_later_request_grows_it_again():
    owner = Owner(_cache(step_bytes=1 << 30))  # the whole move in one step when it is advanced
    owner.append(0, 200)
    cache = owner.cache
    cache.grow_ahead(400, owner.lengths)
    cache.grow_ahead(1200, owner.lengths)  # asked for while moving: the next move's size
    owner.truncate(0, 190)
    owner.append(0, 80)  # needs 270 > 256 now: the move completes at once, then the write
    assert cache.capacity == 512 and cache.moving is not None  # ... and the next move has begun
    owner.assert_intact()
    owner.append(1, 30)
    cache.advance(owner.lengths)
    assert cache.capacity == 1280 and cache.moving is None
    owner.assert_intact()
    cache.advance(owner.lengths)  # nothing moving: nothing happens
    assert cache.capacity == 1280

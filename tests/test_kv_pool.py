"""The KV cache by the block (backends/kv_pool.py): claims, blocks per slot, sharing and copy on write."""

import pytest
import torch

from specdecode.backends.kv_pool import KVMemoryFull, KVPool


def pool(blocks=9, slots=3, block=4, max_length=64):
    return KVPool((2, 1, 2), slots, max_length, blocks, torch.float32, torch.device("cpu"), block)


def test_a_slot_owns_the_blocks_of_its_own_positions_and_gives_them_back():
    p = pool()
    p.ensure(0, 9)  # 3 blocks of 4
    p.ensure(1, 1)
    assert p.owned == [[1, 2, 3], [4], []] and p.in_use() == 4
    assert p.table[0, :4].tolist() == [1, 2, 3, 0] and p.table[1, 0] == 4
    p.trim(0, 5)  # positions 0..4 stay: two blocks
    assert p.owned[0] == [1, 2] and p.table[0, 2] == 0 and p.in_use() == 3
    p.ensure(2, 4)
    assert p.owned[2] == [3]  # the lowest free block goes first
    assert not p.k[:, 0].any() and not p.v[:, 0].any()  # block 0: the zeros unused entries read


def test_claims_promise_blocks_and_an_unclaimed_write_fails_cleanly():
    p = pool(blocks=5)  # 4 usable blocks
    assert p.claim(0, 9) and p.unclaimed() == 1  # 3 blocks set aside, none taken yet
    assert not p.claim(1, 9) and p.claims[1] == 0  # not enough: nothing claimed
    assert p.claim(1, 4)
    p.ensure(0, 12)  # its own claim
    assert p.claims[0] == 0 and p.unclaimed() == 0
    with pytest.raises(KVMemoryFull, match="all in use"):
        p.ensure(2, 1)
    p.trim(0, 0)  # a sequence that ends gives its blocks and claim back
    assert p.unclaimed() == 3 and p.claim(2, 12)


def test_shared_blocks_are_copied_before_a_write_and_freed_by_their_last_holder():
    p = pool()
    p.ensure(0, 6)  # blocks 1, 2 (position 4, 5 in block 2)
    p.k[:, 1:3] = torch.randn(2, 2, 1, 4, 2)
    p.hold(p.blocks_of(0, 6))  # the prefix cache keeps them
    p.trim(0, 0)
    assert p.in_use() == 2  # held: not free
    p.share(1, [1, 2])  # a new prompt starting alike: the same blocks in its table
    assert p.owned[1] == [1, 2] and p.refs[1] == p.refs[2] == 2
    before = p.k[:, 2].clone()
    p.writable(1, 6, 8)  # decoding goes on inside the shared partial block: it is copied first
    fresh = p.owned[1][1]
    assert fresh not in (1, 2) and p.owned[1][0] == 1 and p.table[1, 1] == fresh
    assert torch.equal(p.k[:, fresh], before) and p.refs[2] == 1
    p.unhold([1, 2])
    assert p.refs[1] == 1 and p.refs[2] == 0 and 2 in p.free  # block 1 still the slot's


def test_gather_reads_a_slots_positions_in_order_and_zeros_past_its_blocks():
    p = pool()
    p.ensure(0, 6)
    p.ensure(1, 2)
    p.k[:, p.owned[0]] = torch.arange(2 * 2 * 4 * 2, dtype=torch.float32).view(2, 2, 1, 4, 2)
    k, v = p.gather(1, [0, 1], 7)  # [2 slots, kv heads 1, 7 positions, d 2]
    assert k.shape == (2, 1, 7, 2)
    assert torch.equal(k[0, 0, :4], p.k[1, p.owned[0][0], 0]) and torch.equal(
        k[0, 0, 4:7], p.k[1, p.owned[0][1], 0, :3]
    )
    assert not k[1, 0, 4:].any()  # slot 1 has one block: the rest reads block 0
    blocks, offsets = p.where(torch.tensor([0, 0, 1]), torch.tensor([3, 5, 1]))
    assert blocks.tolist() == [p.owned[0][0], p.owned[0][1], p.owned[1][0]] and offsets.tolist() == [3, 1, 1]


def test_a_pool_too_small_to_hold_one_block_is_refused():
    with pytest.raises(KVMemoryFull.__mro__[1], match="at least 2 blocks"):
        pool(blocks=1)


def test_a_block_is_zeroed_the_first_time_it_is_handed_out_never_again():
    """The pool is allocated uninitialised (its pages backed only when written): whatever the memory
    held, a block handed out for the first time reads zeros (a padded read of it weighs 0, and
    0 * NaN would not be 0); a block reused later keeps its finite old values, and copies of shared
    blocks never zero a block in use."""
    p = pool()
    p.k[:, 1:].fill_(float("nan"))
    p.ensure(0, 5)  # blocks 1, 2
    assert not p.k[:, 1:3].isnan().any() and p.k[:, 3:].isnan().all()
    p.k[:, 1:3] = 7.0
    p.trim(0, 4)  # block 2 back
    p.ensure(1, 1)  # block 2 again: not zeroed a second time
    assert (p.k[:, 2] == 7.0).all()
    p.hold([2])
    p.writable(1, 0, 1)  # shared: copied into block 3, zeroed first, then filled
    assert p.owned[1] == [3] and (p.k[:, 3] == 7.0).all() and (p.k[:, 1] == 7.0).all()

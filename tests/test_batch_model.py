import pytest
import torch

from conftest import make_llama
from specdecode.backends import models
from specdecode.backends.batch_model import BatchedLlama, PerSlotLM, Row, batched
from specdecode.backends.fast_llama import FastLlama
from specdecode.decoding.control import CostModel
from specdecode.engine.load import BatchCosts


@pytest.fixture(scope="module")
def fast():
    return FastLlama(make_llama(seed=3, layers=2, hidden=64))


def _single(fast, ids):
    fast.reset()
    return fast.extend(ids)  # [n, V]


def test_prefill_chunks_after_cached_tokens_match_single_sequence_logits(fast):
    """Chunks longer than a short row, after cached tokens and beside decode rows, take chunk_attention
    (two flash calls merged): the logits are the single sequence's; it equals the masked attention."""
    from specdecode.backends.batch_model import chunk_attention

    g = torch.Generator().manual_seed(1)
    long, short = torch.randint(0, 384, (330,), generator=g), torch.randint(0, 384, (40,), generator=g)
    ref_long, ref_short = _single(fast, long), _single(fast, short)
    bm = BatchedLlama(fast, slots=2)
    bm.forward([Row(1, short[:30])])
    for a, b in ((0, 100), (100, 230), (230, 330)):  # the second and third chunks start after cached tokens
        out = bm.forward([Row(1, short[30 + a // 100 : 31 + a // 100]), Row(0, long[a:b])])
        assert torch.allclose(out[1].logits, ref_long[a:b], atol=1e-4, rtol=1e-4)
        assert torch.allclose(out[0].logits, ref_short[30 + a // 100 : 31 + a // 100], atol=1e-4, rtol=1e-4)
    q, k, v = (
        torch.randn(6, 50, 8, generator=g),
        torch.randn(2, 250, 8, generator=g),
        torch.randn(2, 250, 8, generator=g),
    )
    mask = torch.arange(250)[None, :] <= (200 + torch.arange(50))[:, None]
    want = torch.nn.functional.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, enable_gqa=True
    )[0]
    assert torch.allclose(chunk_attention(q, k, v, 200), want, atol=1e-5)


def test_ragged_rows_match_single_sequence_logits(fast):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 384, (n,), generator=g) for n in (30, 7, 300, 12)]
    refs = [_single(fast, s) for s in seqs]
    bm = BatchedLlama(fast, slots=5)
    # ragged prefill in slots 4, 1, 2, 0 (not contiguous, not in order); row 3 is a single token
    cuts = [20, 3, 290, 1]
    slots = [4, 1, 2, 0]
    out = [o.logits for o in bm.forward([Row(slot, s[:c]) for slot, s, c in zip(slots, seqs, cuts)])]
    for o, ref, c in zip(out, refs, cuts):
        assert o.shape == (c, 384)
        assert torch.allclose(o, ref[:c], atol=1e-4, rtol=1e-4)
    # verify-like ragged steps with rollback in between: 1..k+1 tokens per row, last rows only
    bm.truncate(4, 15)  # reject drafts: slot 4 back to 15 tokens
    rows = [Row(4, seqs[0][15:30]), Row(2, seqs[2][290:300], num_logits=3), Row(0, seqs[3][1:12])]
    out = [o.logits for o in bm.forward(rows)]
    assert torch.allclose(out[0], refs[0][15:30], atol=1e-4, rtol=1e-4)
    assert out[1].shape == (3, 384) and torch.allclose(out[1], refs[2][297:300], atol=1e-4, rtol=1e-4)
    assert torch.allclose(out[2], refs[3][1:12], atol=1e-4, rtol=1e-4)
    assert [bm.length(s) for s in (4, 1, 2, 0)] == [30, 3, 300, 12]
    assert [len(bm.pool.owned[s]) for s in (4, 1, 2, 0)] == [1, 1, 5, 1]  # its own tokens' blocks of 64
    bm.truncate(2, 100)  # a slot rolled back gives the blocks past its length back
    assert len(bm.pool.owned[2]) == 2 and bm.pool.in_use() == 5
    # /metrics' kv_cache gauges: the share in use falls with it, the memory backed keeps its high-water
    # mark (8 blocks were handed out at most, block 0 besides)
    usage, backed = bm.cache_use()
    assert usage == 5 / (bm.pool.blocks - 1) and backed == 9 * bm.block_bytes


def test_contiguous_slots_match_too(fast):
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 384, (n,), generator=g) for n in (9, 14, 5)]
    refs = [_single(fast, s) for s in seqs]
    bm = BatchedLlama(fast, slots=3)
    out = [o.logits for o in bm.forward([Row(i, s) for i, s in enumerate(seqs)])]
    for o, ref in zip(out, refs):
        assert torch.allclose(o, ref, atol=1e-4, rtol=1e-4)


def test_overflow_is_an_error(fast):
    bm = BatchedLlama(fast, slots=1)
    with pytest.raises(ValueError, match="exceeds max_length"):
        bm.forward([Row(0, torch.zeros(fast.max_length + 1, dtype=torch.long))])


def test_hf_fallback_runs_rows_per_slot(target_hf, target):
    assert isinstance(batched(target.model, 2), BatchedLlama)
    lm = batched(target_hf.model, 2)
    assert isinstance(lm, PerSlotLM)
    a, b = torch.arange(5, 25), torch.arange(40, 47)
    out = [o.logits for o in lm.forward([Row(0, a), Row(1, b, num_logits=1)])]
    ref = models.HFModel(target_hf.model.hf)
    assert torch.allclose(out[0], ref.extend(a), atol=1e-5)
    ref.reset()
    assert torch.allclose(out[1], ref.extend(b)[-1:], atol=1e-5)
    lm.truncate(0, 0)
    assert lm.length(0) == 0 and lm.length(1) == 7


def test_load_cap_shrinks_k_when_verification_gets_expensive():
    # one row verifies 5 tokens for the price of ~1; at eight rows each extra token costs half a step
    times = {(1, n): 1.0 + 0.05 * (n - 1) for n in range(1, 6)}
    times |= {(8, n): 4.0 + 2.0 * (n - 1) for n in range(1, 6)}
    costs = BatchCosts(times)
    assert isinstance(costs.cost(8), CostModel) and costs.cost(8).r(4) == pytest.approx(3.0)
    assert costs.cap(1, [0.6], 4) == 4  # alone: never capped
    assert costs.cap(2, [0.6], 4) < 4  # batch 2 uses the nearest measured size above (8)
    assert costs.cap(8, [0.3], 4) == 0  # low acceptance: stop speculating under load
    assert costs.cap(8, [0.99], 4) == 4  # near-certain drafts still pay off
    costs.observe(8, 5, 0.0)  # refreshed online (EWMA)
    assert costs.times[(8, 5)] < 12.0


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3", "phi3"])
def test_other_families_batch_with_their_windows_and_rotary_tables(family):
    """Gemma 3 (a sliding window of 16 the rows outgrow, a local and a global rotary table, scaled
    embedding, its q.k scale), Qwen3 and Phi-3 rows in one batch give the single-sequence logits."""
    from test_families import make

    fast = FastLlama(make(family))
    assert isinstance(batched(fast, 3), BatchedLlama)
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 384, (n,), generator=g) for n in (90, 40, 6)]
    refs = [_single(fast, s) for s in seqs]
    bm = BatchedLlama(fast, slots=3)
    out = [o.logits for o in bm.forward([Row(i, s[:c]) for i, (s, c) in enumerate(zip(seqs, (70, 40, 1)))])]
    for o, ref, c in zip(out, refs, (70, 40, 1)):
        assert torch.allclose(o, ref[:c], atol=1e-4, rtol=1e-4)
    out = [
        o.logits for o in bm.forward([Row(0, seqs[0][70:90]), Row(2, seqs[2][1:6])])
    ]  # decode-like steps past the window
    assert torch.allclose(out[0], refs[0][70:90], atol=1e-4, rtol=1e-4)
    assert torch.allclose(out[1], refs[2][1:6], atol=1e-4, rtol=1e-4)


def test_the_kv_cache_grows_geometrically_keeping_its_contents():
    from specdecode.backends.layer import CACHE_BLOCK, grow_kv

    dims = (2, 3, 1, 4)
    k, v = grow_kv(None, None, 10, 10_000, dims, torch.float32, torch.device("cpu"))
    assert k.shape == (2, 3, 1, CACHE_BLOCK, 4)
    k.normal_(), v.normal_()
    k0, v0 = k.clone(), v.clone()
    caps, grown = [], 0
    for needed in range(CACHE_BLOCK + 1, 4096 + 1, 64):  # a long prompt arriving 64 positions at a time
        k2, v2 = grow_kv(k, v, needed, 10_000, dims, torch.float32, torch.device("cpu"))
        grown += k2 is not k
        k, v = k2, v2
        caps.append(k.shape[3])
        assert k.shape[3] >= needed
    assert grown <= 4  # 512, 1024, 2048, 4096: doubling, not one copy per chunk
    assert torch.equal(k[:, :, :, :CACHE_BLOCK], k0) and torch.equal(v[:, :, :, :CACHE_BLOCK], v0)
    assert not k[:, :, :, CACHE_BLOCK:].any()  # new room is zeros (masked keys never meet NaN values)
    assert grow_kv(k, v, 5000, 4200, dims, torch.float32, torch.device("cpu"))[0].shape[3] == 4200  # capped


def test_attention_groups_keep_chunks_alone_and_bucket_decode_rows_by_context():
    from specdecode.backends.batch_model import SHORT_CONTEXT, _attention_groups

    counts = [1, 5, 300, 1, 2, 40]
    ends = [50, 60, 800, 4000, 70 + 2 * SHORT_CONTEXT, 900]
    groups = _attention_groups(counts, ends)
    assert sorted(i for g in groups for i in g) == list(range(6))  # every row in exactly one call
    assert [2] in groups and [5] in groups  # prefill chunks alone
    assert [0, 1] in groups and [4] in groups and [3] in groups  # 4,000 keys do not pad the short ones
    assert _attention_groups([1] * 4, [10, 20, 30, 40]) == [[0, 1, 2, 3]]  # alike contexts share one call


def _rows_alone_and_together(fast, kv_dtype: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Ragged rows in one forward at this KV precision, each checked to get the bits it gets alone (a
    prompt, then a step of 2 tokens) -> (its logits, the single-sequence float32 cache's) per row."""
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 384, (n,), generator=g) for n in (20, 9, 14)]
    bm = BatchedLlama(fast, slots=3, kv_dtype=kv_dtype)
    together = [o.logits for o in bm.forward([Row(i, s) for i, s in enumerate(seqs)])]
    steps = [o.logits for o in bm.forward([Row(i, s[:2]) for i, s in enumerate(seqs)])]
    for i, s in enumerate(seqs):
        alone = BatchedLlama(fast, slots=1, kv_dtype=kv_dtype)
        assert torch.equal(alone.forward([Row(0, s)])[0].logits, together[i])
        assert torch.equal(alone.forward([Row(0, s[:2])])[0].logits, steps[i])
    return [(t, _single(fast, s)) for t, s in zip(together, seqs)]


def test_an_int8_kv_cache_takes_a_ninth_over_a_byte_a_value_and_keeps_rows_independent():
    """--kv-dtype int8: 1.125 bytes a value (32 int8 and a float scale a group); ragged rows in one
    forward get the bits each gets alone; the logits stay close to the float32 cache's (fp16's error
    is a tenth of int8's here). Heads that are not a multiple of 32 wide are refused."""
    from specdecode.backends.batch_model import kv_bytes_per_token

    fast = FastLlama(make_llama(seed=3, layers=2, hidden=128, heads=2, kv_heads=1))  # heads 64 wide
    assert kv_bytes_per_token(fast, "int8") * 32 == kv_bytes_per_token(fast, "fp32") * 9
    assert BatchedLlama(fast, slots=1, kv_dtype="int8").k_cache.dtype == torch.int8
    assert BatchedLlama(fast, slots=1, kv_dtype="int8").k_cache.shape[-1] == 64 + 8
    for got, ref in _rows_alone_and_together(fast, "int8"):  # on this sharp random model 1.1-1.6% of the
        assert (got - ref).abs().mean() < 0.025 * ref.std()  # logits' spread
    with pytest.raises(Exception, match="multiple of 32"):
        BatchedLlama(FastLlama(make_llama(seed=3, layers=1, hidden=64)), slots=1, kv_dtype="int8")


def test_a_float16_kv_cache_halves_the_blocks_and_keeps_rows_independent(fast):
    """--kv-dtype fp16: the pool holds float16 blocks (half the bytes a token); ragged rows in one
    forward get the bits each gets alone; the logits stay close to the float32 cache's."""
    from specdecode.backends.batch_model import kv_bytes_per_token

    assert kv_bytes_per_token(fast, "fp16") * 2 == kv_bytes_per_token(fast, "fp32")
    assert BatchedLlama(fast, slots=1, kv_dtype="fp16").k_cache.dtype == torch.float16
    for got, ref in _rows_alone_and_together(fast, "fp16"):
        assert torch.allclose(got, ref, rtol=1e-2, atol=5e-2)  # float16 rounding
    with pytest.raises(Exception, match="unknown KV cache dtype"):
        BatchedLlama(fast, slots=1, kv_dtype="int4")

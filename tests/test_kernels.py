"""kernels.cpp (FastLlama's fused CPU ops) against PyTorch references, and FastLlama with and
without them. The build needs a C++ compiler; where there is none the kernel tests skip and say so,
and FastLlama's eager path (tested here too) is what runs."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from conftest import make_llama
from specdecode.backends import kernels
from specdecode.backends.fast_llama import FastLlama
from specdecode.core.sampling import Warp
from specdecode.decoding.decoder import decode
from specdecode.drafters import NgramDrafter, NoDrafter


@pytest.fixture(scope="module")
def ops():
    module = kernels.load()
    if module is None:
        assert shutil.which("c++") is None, "a C++ compiler is present, yet kernels.cpp did not build"
        pytest.skip("no C++ compiler: FastLlama runs eager ops")
    return module


def test_a_failed_build_falls_back_with_a_message(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "kernels.cpp"
    broken.write_text("#error deliberately broken\n")
    monkeypatch.setattr(kernels, "SOURCES", [broken])
    monkeypatch.setattr(kernels, "cache_root", lambda: tmp_path / "cache")
    assert kernels.load.__wrapped__() is None
    assert "fused CPU kernels unavailable, using eager ops" in capsys.readouterr().err


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("K", [96, 112])  # 112: a last half block of 16 after blocks of 32
def test_linear_matches_matmul_and_a_row_does_not_depend_on_the_others(ops, wdtype, K):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(67, K, generator=g) * 0.1).to(wdtype)  # odd row count: a partial last block
    x = torch.randn(17, K, generator=g)
    y = ops.linear(x, w)
    assert y.shape == (17, 67) and y.dtype == torch.float32
    assert torch.allclose(y.double(), x.double() @ w.double().T, atol=1e-5, rtol=1e-5)
    for m in range(1, 18):  # decoding (one row) and verifying (m rows, 1-3 balanced tiles) give the same bits
        assert torch.equal(ops.linear(x[:m], w), y[:m])
        assert torch.equal(ops.linear(x[m - 1 : m].contiguous(), w), y[m - 1 : m])
    assert torch.equal(ops.linear(x[4:5].contiguous(), w), y[4:5])


def test_drafter_linears_read_bf16_weights_through_the_kernels_where_they_can(ops):
    """head_linear: with the target's kernels a drafter's weight is read as bfloat16 (its values
    rounded once, half the bytes); without them, or with K not a multiple of 16, oneDNN fp32."""
    from specdecode.backends.layer import FusedLinear, Linear, head_linear

    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(40, 96, generator=g), torch.randn(3, 96, generator=g)
    fused = head_linear(w, ops)
    assert isinstance(fused, FusedLinear) and fused.weight.dtype == torch.bfloat16
    torch.testing.assert_close(fused(x), x @ w.bfloat16().float().T, atol=1e-5, rtol=1e-5)
    assert isinstance(head_linear(w, None), Linear) and isinstance(
        head_linear(w[:, :90].contiguous(), ops), Linear
    )
    torch.testing.assert_close(head_linear(w, None)(x), x @ w.T, atol=1e-5, rtol=1e-5)


def test_many_rows_go_in_blocks_without_changing_a_row(ops):
    """A prefill-sized x is cut into blocks of rows that fit L2 (K = 2048: 16 rows of float32); every
    row still gets the bits it gets alone, in any block and tile."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(40, 2048, generator=g) * 0.05, torch.randn(150, 2048, generator=g)
    y = ops.linear(x, w)
    assert torch.allclose(y.double(), x.double() @ w.double().T, atol=1e-4, rtol=1e-5)
    for m in (0, 15, 16, 17, 77, 149):
        assert torch.equal(ops.linear(x[m : m + 1].contiguous(), w), y[m : m + 1])
    assert torch.equal(ops.linear(x[13:40].contiguous(), w), y[13:40])


def test_linear_rejects_bad_shapes(ops):
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.linear(torch.randn(2, 40), torch.randn(8, 40))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.linear(torch.randn(2, 32), torch.randn(8, 32).half())
    with pytest.raises(RuntimeError, match="CPU float32"):
        ops.linear(torch.randn(2, 32).double(), torch.randn(8, 32))


def test_add_rms_norm_and_silu_mul(ops):
    g = torch.Generator().manual_seed(1)
    x, delta, w = (
        torch.randn(3, 64, generator=g),
        torch.randn(3, 64, generator=g),
        torch.rand(64, generator=g),
    )
    stream = x.clone()
    out = ops.add_rms_norm(stream, delta, w, 1e-5)
    assert torch.allclose(stream, x + delta)  # the residual stream is updated in place
    assert torch.allclose(out, F.rms_norm(x + delta, (64,), w, 1e-5), atol=1e-5)
    assert torch.allclose(
        ops.add_rms_norm(x.clone(), None, w, 1e-5), F.rms_norm(x, (64,), w, 1e-5), atol=1e-5
    )
    gu = torch.randn(3, 2 * 48, generator=g)
    assert torch.allclose(ops.silu_mul(gu), F.silu(gu[:, :48]) * gu[:, 48:], atol=1e-6)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _where(*seqs, slots: int = 1):
    """(slot, start, count) per sequence -> the kernel's slots, starts, counts tensors and the block
    table of a cache of `slots` slots, each one block of its capacity ([slots, kvh, cap, d])."""
    return [torch.tensor(col, dtype=torch.long) for col in zip(*seqs)] + [torch.arange(slots)[:, None]]


@pytest.mark.parametrize("tree", [False, True])
# d 64: the register-blocked groups (heads of a kv head, rows of a chain); 32 and 24: the scalar query,
# with the context off the vector width too
@pytest.mark.parametrize("d, start", [(64, 21), (32, 5), (24, 37)])
def test_attention_matches_sdpa_and_writes_the_cache(ops, tree, d, start):
    h, kvh, n, cap = 4, 2, 4, 48
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(n, (h + 2 * kvh) * d, generator=g)
    k_cache, v_cache = torch.randn(kvh, cap, d, generator=g), torch.randn(kvh, cap, d, generator=g)
    k_old, v_old = k_cache.clone(), v_cache.clone()
    angles = torch.randn(n, d // 2, generator=g).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    mask = torch.ones(n, start + n, dtype=torch.bool).tril(start)
    if tree:  # a tree: node 2 is a sibling of node 1, node 3 its child
        mask[:, start:] = torch.tensor(
            [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool
        )
    where = _where((0, start, n))
    out = ops.attention(
        qkv, k_cache[None], v_cache[None], cos, sin, mask if tree else None, *where, h, kvh, 0.0
    )

    q, k, v = qkv.view(n, h + 2 * kvh, d).transpose(0, 1).split([h, kvh, kvh])
    k = _rope(k, cos, sin)
    assert torch.allclose(k_cache[:, start : start + n], k, atol=1e-6)
    assert torch.equal(v_cache[:, start : start + n], v)
    assert torch.equal(k_cache[:, :start], k_old[:, :start]) and torch.equal(
        v_cache[:, start + n :], v_old[:, start + n :]
    )
    ref = F.scaled_dot_product_attention(
        _rope(q, cos, sin)[None],
        k_cache[None, :, : start + n],
        v_cache[None, :, : start + n],
        attn_mask=mask,
        enable_gqa=True,
    )
    assert torch.allclose(out, ref[0].transpose(0, 1).reshape(n, h * d), atol=1e-5)
    for i in range(n):  # a row alone (a decoding step) gets the bits it gets among the others
        one = ops.attention(
            qkv[i : i + 1],
            k_cache[None],
            v_cache[None],
            cos[i : i + 1],
            sin[i : i + 1],
            mask[i : i + 1] if tree else None,
            *_where((0, start + i, 1)),
            h,
            kvh,
            0.0,
        )
        if not tree:
            assert torch.equal(one[0], out[i])


def test_attention_over_sequences_in_slots_is_each_alone(ops):
    """The batched server's shape: rows of three sequences in three cache slots, one call; each
    sequence's rows equal its own call bit for bit, and only its slot is written."""
    h, kvh, d, cap = 6, 2, 64, 40
    g = torch.Generator().manual_seed(3)
    seqs = [(2, 30, 1), (0, 7, 4), (1, 0, 3)]  # (slot, start, count): a decode row, a chain, a prefill
    qkv = torch.randn(8, (h + 2 * kvh) * d, generator=g)
    cos, sin = torch.randn(8, d, generator=g), torch.randn(8, d, generator=g)
    k_cache, v_cache = torch.randn(3, kvh, cap, d, generator=g), torch.randn(3, kvh, cap, d, generator=g)
    k_alone, v_alone = k_cache.clone(), v_cache.clone()
    out = ops.attention(qkv, k_cache, v_cache, cos, sin, None, *_where(*seqs, slots=3), h, kvh, 0.0)
    row = 0
    for slot, start, count in seqs:
        rows = slice(row, row + count)
        alone = ops.attention(
            qkv[rows],
            k_alone,
            v_alone,
            cos[rows],
            sin[rows],
            None,
            *_where((slot, start, count), slots=3),
            h,
            kvh,
            0.0,
        )
        assert torch.equal(out[rows], alone)
        row += count
    assert torch.equal(k_cache, k_alone) and torch.equal(v_cache, v_alone)
    with pytest.raises(RuntimeError, match="outside the cache"):
        ops.attention(
            qkv[:1], k_cache, v_cache, cos[:1], sin[:1], None, *_where((3, 0, 1), slots=3), h, kvh, 0.0
        )
    with pytest.raises(RuntimeError, match="rows in all"):
        ops.attention(qkv, k_cache, v_cache, cos, sin, None, *_where((0, 0, 2), slots=3), h, kvh, 0.0)
    bad = _where((0, 0, 1), slots=3)
    bad[3] = torch.tensor([[5], [0], [1]])  # slot 0's block is not one of the cache's 3
    with pytest.raises(RuntimeError, match="not one of the cache's 3"):
        ops.attention(qkv[:1], k_cache, v_cache, cos[:1], sin[:1], None, *bad, h, kvh, 0.0)


@pytest.mark.parametrize("d", [64, 24])  # the register-blocked groups and the scalar query
def test_attention_through_a_block_table_is_the_contiguous_cache_bit_for_bit(ops, d):
    """A paged cache (kv_pool.py): each slot's positions in blocks of 8 scattered over a pool in any
    order, the last one partial; every row's output equals the same cache laid out contiguously, and
    the new keys and values land in the blocks the table names, nowhere else."""
    h, kvh, block = 6, 2, 8
    g = torch.Generator().manual_seed(5)
    seqs = [(1, 29, 1), (0, 13, 4), (2, 0, 3)]  # a decode row past 3 blocks, a chain across a block edge
    qkv = torch.randn(8, (h + 2 * kvh) * d, generator=g)
    cos, sin = torch.randn(8, d, generator=g), torch.randn(8, d, generator=g)
    cap = 32
    k_flat, v_flat = torch.randn(3, kvh, cap, d, generator=g), torch.randn(3, kvh, cap, d, generator=g)
    order = torch.randperm(12, generator=g) + 1  # 12 blocks of 3 slots, block 0 unused
    table = order.view(3, 4)
    k_pool, v_pool = torch.zeros(13, kvh, block, d), torch.zeros(13, kvh, block, d)
    for s in range(3):
        for t in range(4):
            k_pool[table[s, t]] = k_flat[s, :, t * block : (t + 1) * block]
            v_pool[table[s, t]] = v_flat[s, :, t * block : (t + 1) * block]
    flat = ops.attention(qkv, k_flat, v_flat, cos, sin, None, *_where(*seqs, slots=3), h, kvh, 0.0)
    where = _where(*seqs)[:3] + [table]
    paged = ops.attention(qkv, k_pool, v_pool, cos, sin, None, *where, h, kvh, 0.0)
    assert torch.equal(paged, flat)
    for s in range(3):
        for t in range(4):
            assert torch.equal(k_pool[table[s, t]], k_flat[s, :, t * block : (t + 1) * block])
            assert torch.equal(v_pool[table[s, t]], v_flat[s, :, t * block : (t + 1) * block])
    assert not k_pool[0].any() and not v_pool[0].any()


@pytest.fixture(scope="module")
def hf():
    return make_llama(seed=4, layers=2, hidden=64)


def test_fused_and_eager_forwards_agree(ops, hf):
    fused, eager = FastLlama(hf), FastLlama(hf, fused=False)
    assert fused.kernels is not None and eager.kernels is None
    ids = torch.randint(0, hf.config.vocab_size, (90,), generator=torch.Generator().manual_seed(3))
    for chunk, keep in [(70, None), (5, 72), (1, None), (9, 75), (1, None)]:  # 70 > 64: prefill takes SDPA
        start = fused.length
        a, b = fused.extend(ids[start : start + chunk]), eager.extend(ids[start : start + chunk])
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
        if keep is not None:
            fused.truncate(keep), eager.truncate(keep)


def test_fused_verification_equals_decode_steps_bit_for_bit(ops, hf):
    model = FastLlama(hf)
    ids = torch.randint(0, hf.config.vocab_size, (30,), generator=torch.Generator().manual_seed(4))
    model.reset(), model.extend(ids[:20])
    block = model.extend(ids[20:])
    model.truncate(20)
    steps = torch.cat([model.extend(ids[i : i + 1]) for i in range(20, 30)])
    assert torch.equal(block, steps)


def _greedy(model, drafter, prompt, counts=None):
    """Greedy tokens; counts (a dict) collects drafted / accepted."""
    steps = list(
        decode(
            model,
            drafter,
            prompt,
            k=4,
            params=Warp(),
            max_new_tokens=24,
            generator=torch.Generator().manual_seed(0),
        )
    )
    if counts is not None:
        counts["drafted"] = sum(s.drafted for s in steps)
        counts["accepted"] = sum(s.accepted for s in steps)
    return [t for s in steps for t in s.tokens]


def test_bf16_weights_fused_speculation_is_token_identical(ops, hf):
    """bf16 through the kernels: bf16 weights, float32 activations; rows of a verification equal
    decode steps exactly, so greedy speculation reproduces plain bf16 decoding token for token."""
    import copy

    bf16 = FastLlama(copy.deepcopy(hf).to(torch.bfloat16))
    assert bf16.kernels is not None and bf16.dtype == torch.float32
    assert bf16.layers[0].qkv.weight.dtype == torch.bfloat16
    prompt = ([5, 9, 11, 7] * 6)[:22]
    plain = _greedy(bf16, NoDrafter(), prompt)
    counts = {}
    assert _greedy(bf16, NgramDrafter(), prompt, counts) == plain
    assert counts["drafted"] > 0 and counts["accepted"] > 0  # speculation happened
    # and it is the fp32 model with its weights rounded to bf16
    rounded = FastLlama(copy.deepcopy(hf).to(torch.bfloat16).float())
    bf16.reset(), rounded.reset()
    ids = torch.tensor(prompt)
    assert torch.equal(bf16.extend(ids), rounded.extend(ids))


def test_eager_fastllama_speculation_is_token_identical(hf):
    eager = FastLlama(hf, fused=False)
    prompt = ([3, 8, 8, 12, 40] * 5)[:21]
    assert _greedy(eager, NgramDrafter(), prompt) == _greedy(eager, NoDrafter(), prompt)


def test_a_build_lock_left_by_a_killed_build_goes_and_a_live_builder_is_waited_for(tmp_path):
    """cpp_extension waits forever on its lock file, which a killed build leaves behind: while a
    process of ours holds the build guard its lock stays (it is building); once it died, it goes."""
    import fcntl
    import subprocess
    import sys

    from specdecode.backends.kernels import build_guard

    hold = (
        "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print(1, flush=True); "
        "sys.stdin.read()"
    )
    builder = subprocess.Popen(
        [sys.executable, "-c", hold, str(tmp_path / "builder.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert builder.stdout.readline().strip() == b"1"  # it holds the guard
        lock = tmp_path / "lock"
        lock.touch()  # its build's lock
        with open(tmp_path / "builder.lock", "a") as probe:
            with pytest.raises(BlockingIOError):  # build_guard would wait here
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert lock.exists()
    finally:
        builder.kill()  # the build is killed mid-way
        builder.wait()
    with build_guard(tmp_path):
        assert not lock.exists()


# d 64 and 128: the register-blocked groups; 96: the scalar query
@pytest.mark.parametrize("d", [64, 96, 128])
def test_an_int8_cache_stores_q8_rows_and_attention_reads_their_values(ops, d):
    """--kv-dtype int8: new keys (rotated) and values are stored as q8_rows (a scale a group of 32,
    round to nearest even: the torch function and the kernel agree to the bit on values; keys within
    one step of a rotation's rounding); attention over them equals SDPA over their values (q8_values),
    and a row gets the same bits alone as among the others."""
    from specdecode.backends.kv_pool import q8_rows, q8_values

    h, kvh, n, start, cap = 4, 2, 3, 9, 16
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(n, (h + 2 * kvh) * d, generator=g)
    qkv[0, (h + kvh) * d : (h + kvh) * d + 32] = 0.0  # a group of zeros: scale 0, bytes 0
    angles = torch.randn(n, d // 2, generator=g).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    k8 = q8_rows(torch.randn(1, kvh, cap, d, generator=g))
    v8 = q8_rows(torch.randn(1, kvh, cap, d, generator=g))
    assert k8.shape == (1, kvh, cap, d + d // 8) and k8.dtype == torch.int8
    out = ops.attention(qkv, k8, v8, cos, sin, None, *_where((0, start, n)), h, kvh, 0.0)
    q, k, v = qkv.view(n, h + 2 * kvh, d).transpose(0, 1).split([h, kvh, kvh])
    assert torch.equal(v8[0, :, start : start + n], q8_rows(v))
    assert not v8[0, 0, start, :32].any() and q8_values(v8, d)[0, 0, start, :32].eq(0).all()
    keys = q8_values(k8[0, :, start : start + n], d)
    assert torch.allclose(
        keys, _rope(k, cos, sin), atol=q8_values(q8_rows(_rope(k, cos, sin)), d).abs().max() / 127
    )
    mask = torch.ones(n, start + n, dtype=torch.bool).tril(start)
    ref = F.scaled_dot_product_attention(
        _rope(q, cos, sin)[None],
        q8_values(k8, d)[:, :, : start + n],
        q8_values(v8, d)[:, :, : start + n],
        attn_mask=mask,
        enable_gqa=True,
    )
    assert torch.allclose(out, ref[0].transpose(0, 1).reshape(n, h * d), atol=1e-4)
    for i in range(n):
        row = (qkv[i : i + 1], k8, v8, cos[i : i + 1], sin[i : i + 1], None, *_where((0, start + i, 1)))
        assert torch.equal(ops.attention(*row, h, kvh, 0.0)[0], out[i])
    with pytest.raises(RuntimeError, match="multiple of 32"):
        narrow = torch.zeros(1, kvh, cap, 24 + 3, dtype=torch.int8)
        ops.attention(torch.randn(1, (h + 2 * kvh) * 24), narrow, narrow, cos[:1, :24], sin[:1, :24], None,
                      *_where((0, 0, 1)), h, kvh, 0.0)  # fmt: skip


@pytest.mark.parametrize("d", [64, 24])
def test_a_float16_cache_stores_rounded_rows_and_reads_them_widened(ops, d):
    """--kv-dtype fp16: new keys (rotated) and values are stored rounded to nearest, as torch's .half()
    rounds (subnormals and overflow included); attention reads them widened exactly (SDPA over the
    float32 copy of the cache agrees), and a row gets the same bits alone as among the others."""
    h, kvh, n, start, cap = 4, 2, 3, 9, 16
    g = torch.Generator().manual_seed(6)
    qkv = torch.randn(n, (h + 2 * kvh) * d, generator=g)
    edge = torch.tensor([1e-6, -3e-8, 7e4, 65519.0, 65520.0, 2.0**-24 * 1.5])
    qkv[0, (h + kvh) * d : (h + kvh) * d + len(edge)] = edge  # values are stored as given: edge cases
    angles = torch.randn(n, d // 2, generator=g).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()
    k16 = torch.randn(1, kvh, cap, d, generator=g).half()
    v16 = torch.randn(1, kvh, cap, d, generator=g).half()
    out = ops.attention(qkv, k16, v16, cos, sin, None, *_where((0, start, n)), h, kvh, 0.0)
    q, k, v = qkv.view(n, h + 2 * kvh, d).transpose(0, 1).split([h, kvh, kvh])
    assert torch.equal(v16[0, :, start : start + n], v.half())
    assert v16[0, 0, start, : len(edge)].tolist() == edge.half().tolist()
    assert torch.allclose(
        k16[0, :, start : start + n].float(), _rope(k, cos, sin).half().float(), rtol=1e-3, atol=1e-6
    )
    mask = torch.ones(n, start + n, dtype=torch.bool).tril(start)
    ref = F.scaled_dot_product_attention(
        _rope(q, cos, sin)[None],
        k16[:, :, : start + n].float(),
        v16[:, :, : start + n].float(),
        attn_mask=mask,
        enable_gqa=True,
    )
    assert torch.allclose(out, ref[0].transpose(0, 1).reshape(n, h * d), atol=1e-4)
    for i in range(n):
        row = (qkv[i : i + 1], k16, v16, cos[i : i + 1], sin[i : i + 1], None, *_where((0, start + i, 1)))
        one = ops.attention(*row, h, kvh, 0.0)
        assert torch.equal(one[0], out[i])

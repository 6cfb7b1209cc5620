"""--dtype gguf-exact and gguf: GGUF blocks repacked and dequantized in the kernels' registers (exact), or
multiplied with 8-bit activations. Each format against
the `gguf` package's reference dequantization, the quantized matmuls against the float32 kernel on
the dequantized weights (bit for bit) and a float64 reference, row invariance, and a tiny GGUF
Llama whose quantized forward gives the bits of its dequantized fp32 copy and whose greedy
speculative output equals plain decoding."""

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from conftest import make_llama, make_tokenizer
from gguf_fixtures import BLOCKS, random_blocks, write_tiny_gguf
from helpers import assert_lossless, assert_stack_is_per_op
from specdecode import drafters
from specdecode.backends import embedding, gguf_file, gguf_repack, gguf_weights, kernels, layer, models
from specdecode.backends.precision import FP32, GGUF, GGUF_EXACT, Precision
from specdecode.backends.stack import ONE_BLOCK
from specdecode.core.sampling import Warp
from specdecode.decoding.generation import generate
from specdecode.errors import UserError
from specdecode.train.loop import Schedule
from train_fixtures import PROMPTS

ops = kernels.load()
needs_kernels = pytest.mark.skipif(ops is None, reason="no C++ compiler: the fused kernels are unavailable")
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]


def raw_matrix(type_name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    if type_name in BLOCKS:
        return random_blocks(type_name, rows, cols, seed)
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block: q = 8 for Q4_0, d = 0 for the others
    return quants.quantize(w, T[type_name])


@pytest.mark.parametrize("type_name", TYPES)
def test_repacked_blocks_dequantize_to_the_gguf_reference(type_name):
    raw = raw_matrix(type_name, 7, 512)
    ref = torch.from_numpy(quants.dequantize(raw, T[type_name]))
    got = gguf_repack.repack(type_name, raw).dequantize()
    assert got.shape == ref.shape == (7, 512)
    assert torch.equal(got, ref)  # equal values (Q4_0's zeros may carry the other sign)


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_quantized_matmul_is_the_dense_kernel_on_dequantized_weights(type_name):
    m = gguf_repack.repack(type_name, raw_matrix(type_name, 300, 512, seed=1))
    dense = m.dequantize().contiguous()
    f = ops.linear_q4 if m.kind == "q4" else ops.linear_q8
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(2))
    y = f(x, m.scales, m.quants)
    ref = (x.double() @ dense.double().T).float()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4 * float(ref.abs().max()))
    for rows in (1, 2, 3, 5, 8, 9, 17, 64):  # every tile shape, and a row alone vs. with others
        assert torch.equal(
            f(x[:rows].contiguous(), m.scales, m.quants), ops.linear(x[:rows].contiguous(), dense)
        )
        assert torch.equal(f(x[:rows].contiguous(), m.scales, m.quants), y[:rows])


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_many_rows_take_the_dense_gemm_on_the_exact_dequantized_weights(type_name):
    """Over kernels.DENSE_ROWS rows (a long prefill) a quantized matrix is dequantized in C++ to the
    reference values and multiplied by torch's GEMM: the float32 model's route, bit for bit. With
    8-bit activations (the interleaved tile kernels), every row stays in the kernel (its bits as alone)."""
    m = gguf_repack.repack(type_name, raw_matrix(type_name, 96, 512, seed=6))
    dense = (ops.dequantize_q4 if m.kind == "q4" else ops.dequantize_q8)(m.scales, m.quants)
    assert torch.equal(dense, m.dequantize())
    x = torch.randn(kernels.DENSE_ROWS + 40, 512, generator=torch.Generator().manual_seed(7))
    assert torch.equal(gguf_weights.QuantLinear(ops, [m], False)(x), torch.nn.functional.linear(x, dense))
    int8 = gguf_weights.QuantLinear(ops, [m], True)
    assert int8.interleaved and torch.equal(int8(x)[-3:], int8(x[-3:]))


needs_tiles = pytest.mark.skipif(ops is None, reason="no C++ compiler: no fused kernels")


@needs_tiles
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [200, 16, 7])  # a padded last group, one whole group, a lone partial one
def test_interleaved_matmul_is_the_8bit_activations_times_the_files_weights_and_row_invariant(
    type_name, rows
):
    """The tile layout holds the same blocks (pack/unpack round trip), multiplies each row of x
    quantized to 8 bits per block of 32 (q = round(127 x / max|x|)) by the file's weights (equal to a
    float64 product of the same values up to float32 summation) and keeps a row's bits whatever rows
    share the call (tests/native/tile_check.cpp checks the microkernels' bits against tile_ref.h)."""
    m = gguf_repack.repack(type_name, raw_matrix(type_name, rows, 512, seed=5))
    packed = gguf_weights.Interleaved.pack(ops, m)
    back = packed.unpack(ops)
    assert torch.equal(back.scales, m.scales) and torch.equal(back.quants, m.quants)
    # the file's fp16 scales stay 16-bit; K-quants' scales stay factored as the file keeps them
    k_quant = type_name in ("Q4_K", "Q6_K")
    assert packed.scales.dtype == (torch.uint8 if k_quant else torch.float16)
    assert (back.factors is not None) == k_quant and (not k_quant or torch.equal(back.factors, m.factors))
    # one scale a block of 32 (Q8_0's d; Q5_0's) is kept once: "_0"; weights in -16..15 (Q5_0) in 5 bits,
    # in -32..31 (Q6_K) in 6
    assert packed.kind == {"Q8_0": "q8_0", "Q5_0": "q5_0", "Q6_K": "q6"}.get(type_name, m.kind)
    assert packed.scales.shape[2] == (
        gguf_weights.FACTORED if k_quant else 1 if packed.kind.endswith("_0") else 2
    )
    f = getattr(ops, f"linear_{packed.kind}_tile")
    x = torch.randn(37, 512, generator=torch.Generator().manual_seed(6))
    y = f(x, packed.scales, packed.quants, rows)
    blocks = x.view(37, -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    x8 = (torch.round(blocks / torch.where(d > 0, d, 1)) * d).view(
        37, 512
    )  # the rows as the kernel sees them
    assert y.shape == (37, rows)
    torch.testing.assert_close(y, (x8.double() @ m.dequantize().double().T).float(), rtol=1e-5, atol=1e-4)
    ref = x @ m.dequantize().T
    assert float((y - ref).norm() / ref.norm()) < 0.02
    for i in [0, 1, 8, 9, 36]:
        assert torch.equal(f(x[i : i + 1].contiguous(), packed.scales, packed.quants, rows)[0], y[i])
    assert torch.equal(f(x[3:12].contiguous(), packed.scales, packed.quants, rows), y[3:12])


@needs_tiles
@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_k_quant_scales_kept_factored_give_the_bits_of_float32_scales(type_name, monkeypatch):
    """A K-quant's block scales, each a super-block factor times a small integer, are kept as the file
    keeps them (a third of float32's bytes) and the kernels form the very float32 scales: the same
    bits in every tile shape, in a lone call and in the native stack's layout; rows picked from it
    slice by slice are those picked from it whole. A scale that is no integer multiple of its factor
    keeps the float32 layout."""
    m = gguf_repack.repack(type_name, raw_matrix(type_name, 40, 512, seed=7))
    factored = gguf_weights.Interleaved.pack(ops, m)
    plain = gguf_weights.Interleaved.pack(ops, gguf_repack.QuantMatrix(m.kind, m.scales, m.quants))
    assert factored.scales.dtype == torch.uint8 and plain.scales.dtype == torch.float32
    assert factored.scales.nbytes * 3 < plain.scales.nbytes
    f = getattr(ops, f"linear_{factored.kind}_tile")
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(8))
    for rows in (1, 2, 5, 8, 11):
        got = f(x[:rows].contiguous(), factored.scales, factored.quants, 40)
        assert torch.equal(got, f(x[:rows].contiguous(), plain.scales, plain.quants, 40))
    picked = gguf_weights.Interleaved.pack(ops, factored.unpack(ops).rows(torch.tensor([9, 2, 33])))
    index = torch.tensor([39, 9, 2, 33, 16, 17, 0])  # across slices of 16 rows, the partial last group
    for at_once in (16, 32, 8192):
        monkeypatch.setattr(gguf_weights, "ROWS_AT_ONCE", at_once)
        sliced, whole = factored.rows(ops, index), factored.unpack(ops).rows(index)
        for a, b in zip(
            (sliced.scales, sliced.quants, sliced.factors), (whole.scales, whole.quants, whole.factors)
        ):
            assert torch.equal(a, b)
    assert picked.scales.dtype == torch.uint8
    assert torch.equal(
        f(x, picked.scales, picked.quants, 3), f(x, plain.scales, plain.quants, 40)[:, [9, 2, 33]]
    )
    odd = m.scales.clone()
    odd[3, 1, 0] += 0.5 * m.factors[3, 0, 0] if m.factors[3, 0, 0] != 0 else 1.0
    kept = gguf_weights.Interleaved.pack(ops, gguf_repack.QuantMatrix(m.kind, odd, m.quants, m.factors))
    assert kept.scales.dtype == torch.float32
    with pytest.raises(RuntimeError, match="factored"):
        f(x, factored.scales[:, :1].contiguous(), factored.quants, 40)


@needs_tiles
@pytest.mark.parametrize("type_name,bits", [("Q5_0", 5), ("Q6_K", 6), ("Q8_0", 8)])
@pytest.mark.parametrize("rows", [40, 16])
def test_weights_that_fit_fewer_bits_are_kept_in_fewer_and_give_the_eight_bit_bits(type_name, bits, rows):
    """An 8-bit matrix whose weights all lie in -16..15 (Q5_0) is stored in 5 bits a weight, in -32..31
    (Q6_K) in 6, and gives the 8-bit kernel's bits in every tile shape; one weight outside the range
    keeps the next wider layout."""
    m = gguf_repack.repack(type_name, raw_matrix(type_name, rows, 512, seed=9))
    packed = gguf_weights.Interleaved.pack(ops, m)
    assert packed.kind[1] == str(bits) and packed.quants.shape[2] == 64 * bits
    if bits == 8:
        return
    eight = gguf_weights._widen(packed.quants, bits)
    assert torch.equal(gguf_weights._narrow(eight, bits), packed.quants)
    narrow, wide8 = (
        getattr(ops, f"linear_{packed.kind}_tile"),
        getattr(ops, f"linear_{packed.kind.replace(str(bits), '8')}_tile"),
    )
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(10))
    for n in (1, 3, 8, 11):
        xs = x[:n].contiguous()
        assert torch.equal(
            narrow(xs, packed.scales, packed.quants, rows), wide8(xs, packed.scales, eight, rows)
        )
    outside = m.quants.clone()
    outside[rows - 1, 5] = 1 << (bits - 1)  # one past the range
    kind = gguf_weights.Interleaved.pack(ops, gguf_repack.QuantMatrix(m.kind, m.scales, outside)).kind
    assert kind[1] == {5: "6", 6: "8"}[bits]


@needs_tiles
@pytest.mark.parametrize("type_name", TYPES)
def test_a_matrix_packed_chunk_by_chunk_is_the_matrix_packed_whole(type_name, monkeypatch):
    """pack_chunks (the LM head's load, a chunk at a time) compacts each chunk into its place and gives
    the very layout, scales and bytes of packing the whole; a chunk that compacts to another format
    than the first (here: a weight outside the narrow range, or an odd scale) sends the whole through
    the widest format, as one matrix would go."""
    monkeypatch.setattr(gguf_repack, "ROWS_AT_ONCE", 32)  # 3 chunks of 40 + 32 + 8 rows, the last short
    raw = raw_matrix(type_name, 72, 512, seed=11)

    def same(a, b):
        assert a.kind == b.kind and a.n == b.n and a.scales.dtype == b.scales.dtype
        assert torch.equal(a.scales, b.scales) and torch.equal(a.quants, b.quants)

    def chunked(raw):
        return gguf_weights.Interleaved.pack_chunks(
            ops, lambda: gguf_repack.repack_chunks(type_name, raw, "w"), len(raw)
        )

    assert len(list(gguf_repack.repack_chunks(type_name, raw, "w"))) == 3
    same(chunked(raw), gguf_weights.Interleaved.pack(ops, gguf_repack.repack(type_name, raw)))
    whole = gguf_repack.repack(type_name, raw)
    if whole.kind == "q8" and type_name != "Q8_0":  # Q5_0 / Q6_K: one weight past the narrow range
        quants = whole.quants.clone()
        quants[70, 3] = 127
        m = gguf_repack.QuantMatrix(whole.kind, whole.scales, quants, whole.factors)
        parts = [m.rows(torch.arange(i, min(i + 32, 72))) for i in range(0, 72, 32)]
        got = gguf_weights.Interleaved.pack_chunks(ops, lambda: iter(parts), 72)
        assert got.kind[1] == "8"  # the first chunks alone would have narrowed
        same(got, gguf_weights.Interleaved.pack(ops, m))


@needs_tiles
def test_interleaved_shapes_are_checked():
    m = gguf_repack.repack("Q4_1", raw_matrix("Q4_1", 20, 64))
    packed = gguf_weights.Interleaved.pack(ops, m)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.linear_q4_tile(torch.randn(1, 48), packed.scales, packed.quants, 20)
    with pytest.raises(RuntimeError, match="quants"):
        ops.linear_q4_tile(torch.randn(1, 64), packed.scales, packed.quants, 40)
    with pytest.raises(RuntimeError, match="quants"):
        ops.linear_q8_tile(torch.randn(1, 64), packed.scales, packed.quants, 20)
    q8_0 = gguf_weights.Interleaved.pack(ops, gguf_repack.repack("Q8_0", raw_matrix("Q8_0", 20, 64)))
    with pytest.raises(RuntimeError, match=r"K / 32, 2, 16\]"):  # two scales a block expected
        ops.linear_q8_tile(torch.randn(1, 64), q8_0.scales, q8_0.quants, 20)
    with pytest.raises(RuntimeError, match=r"K / 32, 1, 16\]"):
        ops.linear_q8_0_tile(torch.randn(1, 64), torch.cat([q8_0.scales] * 2, 2), q8_0.quants, 20)


@needs_kernels
def test_bad_quantized_shapes_are_errors():
    m = gguf_repack.repack("Q4_1", raw_matrix("Q4_1", 4, 64))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ops.linear_q4(torch.randn(1, 48), m.scales, m.quants)
    with pytest.raises(RuntimeError, match="quants"):
        ops.linear_q4(torch.randn(1, 64), m.scales, m.quants[:, :16].contiguous())


def test_types_without_a_kernel_fall_back_to_float32_or_name_the_type():
    w = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    raw = quants.quantize(w, T.Q5_1)
    got = gguf_repack.repack("Q5_1", raw)  # the gguf package reads it; the fp32 kernel runs it
    assert isinstance(got, torch.Tensor) and torch.equal(
        got, torch.from_numpy(quants.dequantize(raw, T.Q5_1))
    )
    with pytest.raises(UserError, match="blk.0.ffn_up.weight has type Q9_9"):
        gguf_repack.repack("Q9_9", raw, "blk.0.ffn_up.weight")
    with pytest.raises(UserError, match="not a whole number of Q4_1 blocks"):
        gguf_repack.repack("Q4_1", np.zeros((2, 30), np.uint8), "x")


MIXED = {
    "attn_q": "Q4_1",
    "attn_k": "Q4_0",
    "attn_v": "Q6_K",
    "attn_output": "Q4_K",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q4_1",
    "ffn_down": "Q6_K",
    "token_embd": "Q8_0",
    "output": "Q4_0",
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("SPECDECODE_CACHE", str(tmp_path_factory.mktemp("cache")))
    tok = make_tokenizer()
    hf = make_llama(seed=1, hidden=256, heads=4, kv_heads=2, intermediate=512, eos_id=tok.eos_token_id)
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", hf, tok, MIXED)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def pair(tiny_gguf):
    """(fp32 on the dequantized copy, gguf on the quantized blocks) of the same file."""
    return models.load(tiny_gguf, FP32, "cpu"), models.load(tiny_gguf, GGUF_EXACT, "cpu")


@needs_kernels
def test_quantized_forward_gives_the_bits_of_the_dequantized_model(pair):
    fp32, quant = (p.model for p in pair)
    assert isinstance(quant.layers[0].gate_up, gguf_weights.QuantLinear)
    assert quant.hf.model.layers[0].mlp.down_proj.weight.numel() == 0  # the float32 copy is released
    ids = torch.randint(0, 384, (80,), generator=torch.Generator().manual_seed(0))
    for m in (fp32, quant):
        m.reset()
    assert torch.equal(fp32.extend(ids[:70]), quant.extend(ids[:70]))  # a long prefill (eager path)
    for n in (1, 4, 3):  # decode and verification steps (fused path)
        chunk = ids[70 : 70 + n]
        assert torch.equal(fp32.extend(chunk), quant.extend(chunk))
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    positions = torch.tensor([fp32.length, fp32.length + 1, fp32.length + 1])
    tree = ids[:3]
    assert torch.equal(fp32.extend_tree(tree, positions, mask), quant.extend_tree(tree, positions, mask))


@needs_kernels
@pytest.mark.parametrize("spec", ["ngram", "draft:{draft}", "suffix"])
def test_greedy_speculation_on_quantized_weights_equals_plain(pair, tiny_draft_dir, spec):
    target = pair[1]
    ctx = drafters.DrafterContext(target, GGUF_EXACT)
    plain, drafter = drafters.build("none", ctx), drafters.build(spec.format(draft=tiny_draft_dir), ctx)
    # random blocks: these drafters check the rejection path; acceptance on a GGUF target is checked by
    # the file drafting for itself (test_gguf_identity.py) and the trained heads below
    outputs, _ = assert_lossless(target, plain, drafter, PROMPTS[:4], k=4, max_new_tokens=40, min_accepted=0)
    fp32_plain = drafters.build("none", drafters.DrafterContext(pair[0]))
    for prompt, tokens in zip(PROMPTS[:4], outputs):  # and the dequantized model's
        assert (
            tokens
            == generate(
                pair[0], fp32_plain, pair[0].tokenizer(prompt)["input_ids"], max_new_tokens=40
            ).token_ids
        )


@needs_kernels
def test_trained_head_on_quantized_target_equals_plain(pair, tmp_path):
    from specdecode.train import medusa
    from train_fixtures import make_data

    fp32, target = pair
    data_dir = make_data(target, tmp_path / "data", max_new_tokens=24)  # generated on the quantized model
    medusa.train(
        fp32, data_dir, tmp_path / "medusa", Schedule(steps=20, lr=1e-2), batch_tokens=128, vocab=300
    )
    ctx = drafters.DrafterContext(target, GGUF_EXACT)  # same embedding: the fingerprint matches
    plain, head = drafters.build("none", ctx), drafters.build(f"medusa:{tmp_path / 'medusa'}", ctx)
    assert_lossless(target, plain, head, PROMPTS[:3], k=3, max_new_tokens=30)


@needs_tiles
def test_medusa_beside_an_int8_target_mixes_on_its_int8_path_losslessly(tiny_gguf, pair, tmp_path):
    from specdecode.train import medusa
    from train_fixtures import make_data

    data_dir = make_data(pair[0], tmp_path / "data", max_new_tokens=24)
    medusa.train(
        pair[0], data_dir, tmp_path / "medusa", Schedule(steps=20, lr=1e-2), batch_tokens=128, vocab=300
    )
    target = models.load(tiny_gguf, GGUF, "cpu")
    ctx = drafters.DrafterContext(target, GGUF)
    plain, head = drafters.build("none", ctx), drafters.build(f"medusa:{tmp_path / 'medusa'}", ctx)
    assert isinstance(head.mix, gguf_weights.QuantLinear) and head.mix.interleaved
    _, drafted = assert_lossless(target, plain, head, PROMPTS[:3], k=3, max_new_tokens=30)
    assert drafted > 0


@needs_kernels
def test_int8_activations_keep_greedy_speculation_lossless(tiny_gguf):
    target = models.load(tiny_gguf, GGUF, "cpu")
    qkv = target.model.layers[0].qkv
    assert qkv.interleaved and isinstance(qkv.parts[0], gguf_weights.Interleaved)  # the tiles, on every ISA
    ctx = drafters.DrafterContext(target, GGUF)
    plain, ngram = drafters.build("none", ctx), drafters.build("ngram", ctx)
    assert_lossless(target, plain, ngram, PROMPTS[:4], k=4, max_new_tokens=40, min_accepted=0)
    own = drafters.build(f"draft:{tiny_gguf}", ctx)  # the file drafting for itself: accepted
    assert_lossless(target, plain, own, PROMPTS[:2], k=4, max_new_tokens=24, min_accepted=20)


@needs_tiles
def test_gguf_rows_get_the_same_bits_in_any_call(tiny_gguf):
    """On the VNNI kernels every forward is fused and row-invariant: a long prefill (more rows than
    DENSE_ROWS), a verification chain, a tree and the batched server's mixed rows all give each row
    the logits a one-token decoding step gives it, bit for bit (so serve --dtype gguf answers as a
    single request does)."""
    from specdecode.backends.batch_model import Row, batched

    model = models.load(tiny_gguf, GGUF, "cpu").model
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(model.vocab_size, (n,), generator=g) for n in (90, 5, 31)]

    def stepwise(tokens):  # one token per forward: the decoding loop's rows
        model.reset()
        return torch.cat([model.extend(tokens[i : i + 1]) for i in range(len(tokens))])

    alone = [stepwise(t) for t in seqs]
    model.reset()
    assert torch.equal(model.extend(seqs[0]), alone[0])  # 90 rows in one call (> DENSE_ROWS)
    model.reset()
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # node 2 a sibling of node 1
    model.extend(seqs[1][:3])
    nodes = torch.stack([seqs[1][3], seqs[1][4], seqs[2][0]])
    tree_logits = model.extend_tree(nodes, torch.tensor([3, 4, 4]), tree)
    assert torch.equal(tree_logits[:2], alone[1][3:5])  # the path 0 -> 1 is the chain
    sibling = stepwise(torch.cat([seqs[1][:4], seqs[2][:1]]))[-1]  # node 2 sees node 0 one slot back
    assert torch.equal(tree_logits[2], sibling)
    lm = batched(model, 3)
    outs = lm.forward([Row(s, t[:-1]) for s, t in enumerate(seqs)])  # prefills of 89, 4 and 30 rows together
    outs += lm.forward([Row(s, t[-1:]) for s, t in enumerate(seqs)])  # one decoding row each
    for s, want in enumerate(alone):
        assert torch.equal(torch.cat([outs[s].logits, outs[3 + s].logits]), want)


@needs_tiles
def test_the_native_stack_gives_the_per_op_paths_bits(tiny_gguf):
    """backends/stack.py runs all layers and the LM head in one native call; its logits and captured
    layer outputs equal those of fused_layers' per-op path (the head a call of its own) bit for bit:
    a prefill, a decoding step, a chain, a tree, batched rows (helpers.assert_stack_is_per_op)."""
    model = models.load(tiny_gguf, GGUF, "cpu").model
    assert model.stack is not None  # a Llama-form file on VNNI: every forward goes through it
    assert model.stack.head is None  # ... its LM head included
    ids = torch.randint(model.vocab_size, (46,), generator=torch.Generator().manual_seed(3))
    assert_stack_is_per_op(model, ids)


@needs_tiles
def test_a_chain_from_token_ids_gives_the_stacks_bits_and_names_a_bad_id(tiny_gguf):
    """FastLlama's and BatchedLlama's chains go to the native stack as token ids (forward_ids gathers
    the embedding and rotary rows); prefill, decoding step, draft chain and batched rows keep the bits of
    the stack fed torch's rows. An id outside the vocabulary is an error naming it, and leaves the cache
    as it was."""
    from specdecode.backends.batch_model import Row, batched

    model = models.load(tiny_gguf, GGUF, "cpu").model
    assert model.stack is not None and model.stack.by_ids
    seq = torch.randint(model.vocab_size, (25,), generator=torch.Generator().manual_seed(5))
    last = model.config.num_hidden_layers - 1

    def run():
        model.reset()
        outs = [model.forward(seq[:20], num_logits=1, layers=(0, last)), model.forward(seq[20:21])]
        outs.append(model.forward(seq[21:], layers=(1,)))
        lm = batched(model, 2)
        outs += lm.forward([Row(0, seq[:9]), Row(1, seq[3:5], layers=(0,))])
        outs += lm.forward([Row(1, seq[5:6]), Row(0, seq[9:12])])
        return [o.logits for o in outs] + [outs[0].features, outs[2].features, outs[4].features]

    by_ids = run()
    model.stack.by_ids = False
    by_rows = run()
    model.stack.by_ids = True
    assert [t.shape[0] for t in by_ids] == [1, 1, 4, 9, 2, 1, 3, 20, 4, 2]
    for a, b in zip(by_ids, by_rows):
        assert torch.equal(a, b)
    # the native gather (a float table) raises RuntimeError, a lookup in the file's blocks IndexError
    with pytest.raises((RuntimeError, IndexError), match=f"id {model.vocab_size} outside the vocabulary"):
        model.forward(torch.tensor([3, model.vocab_size]))
    assert model.length == 25


@needs_tiles
@pytest.mark.parametrize("bits", [8, 4])
def test_the_eagle_heads_native_step_follows_its_torch_step(tiny_gguf, bits):
    """Beside a gguf target on VNNI, an EAGLE draft step is one native call (a one-layer stack whose q|k|v
    read the pair [norm_emb(embed(token)); norm_feat(feature)]): the features it syncs, the logits and
    outputs of its chain and tree steps follow the head's torch step on the same 8-bit linears, and it
    drafts the same tokens. A pair stack refuses a call without the embedding rows."""
    import copy

    from specdecode.drafters.eagle import EagleDrafter
    from specdecode.drafters.eagle_head import EagleHead

    target = models.load(tiny_gguf, GGUF, "cpu").model
    torch.manual_seed(0)
    head = EagleHead(256, 2 * 256, 4, 2, 64, 512, eps=1e-5)
    for p in head.parameters():  # trained-looking norms, not all ones
        p.data.add_(0.05 * torch.randn_like(p))
    token_map = torch.randperm(target.vocab_size)[:200]
    native = EagleDrafter(copy.deepcopy(head), token_map, target, (0, 1), bits=bits)
    eager = EagleDrafter(head, token_map, target, (0, 1), bits=bits)
    assert {lin.linear.parts[0].kind for lin in (native.head.qkv, native.head.down)} == {
        "q4" if bits == 4 else "q8"
    }
    assert native.native is not None
    eager.native = None
    context = torch.randint(target.vocab_size, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    features = torch.randn(29, 2 * 256)
    results = []
    for d in (native, eager):
        with torch.inference_mode():
            results.append(_eagle_steps(d, context, features))
    assert results[0][0] == results[1][0] and len(results[0][0]) == 4
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert results[0][2:] == results[1][2:]
    k, v = native.cache.reserve(40)
    ids, embed = native.embedding.gathered([1])
    with pytest.raises(RuntimeError, match="feat: a stack with a pair norm needs the residual rows"):
        native.native.stack.forward_ids(
            ids, [0], [0], [1], ONE_BLOCK, embed, k, v, [native.cos], [native.sin], [], [], None
        )


def _eagle_steps(d, context: list[int], features):
    """An EAGLE drafter's greedy chain, its synced root and logits, a two-row chain step, a two-sibling tree
    step and an EAGLE-2 tree, on one context."""
    d.begin(context)
    d.feed(features)
    greedy = d.propose(context, 4, Warp(), None).tokens.tolist()
    d._sync(context)
    rows = [d.root_logits, d.root.clone()]
    rows += d._rows([context[3], context[7]], d.root.expand(2, -1).clone())  # a two-row chain
    mask = torch.tensor([[True, False], [False, True]])  # two siblings under the root
    rows += d._rows([context[5], context[9]], d.root.expand(2, -1).clone(), [29, 29], mask)
    d.branches, d.nodes = 2, 5
    tree = d.propose(context, 3, Warp(), None)
    return greedy, rows, tree.tokens.tolist(), tree.parents


def test_gguf_dtype_needs_a_gguf_file(tiny_model_dir):
    with pytest.raises(UserError, match="is not a .gguf file"):
        models.load(tiny_model_dir, GGUF, "cpu")
    with pytest.raises(UserError, match="unknown dtype 'q4'.*gguf"):
        Precision.parse("q4")


@needs_kernels
def test_auto_dtype_picks_gguf_for_gguf_llamas_on_cpu(tiny_gguf, tiny_model_dir, capsys):
    from specdecode import cli

    assert models.auto_dtype(tiny_gguf, "cpu") == GGUF
    assert models.auto_dtype(tiny_gguf, "cpu", quant="int8") == FP32
    assert models.auto_dtype(tiny_gguf, "cpu", backend="hf") == FP32
    assert models.auto_dtype(tiny_model_dir, "cpu") == FP32
    assert (
        cli.main(
            [
                "generate",
                "The quick brown fox",
                "--target",
                tiny_gguf,
                "--device",
                "cpu",
                "--threads",
                "1",
                "--max-new-tokens",
                "8",
                "--no-chat",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip()


@needs_kernels
@pytest.mark.parametrize(
    "family, extra",
    [
        ("qwen2", {}),  # biases, q/k rows not rotated
        (
            "qwen3",
            {"head_dim": 128},
        ),  # q/k norms (transformers reads no head_dim from a qwen3 file: its default, 128)
        ("phi3", {}),  # fused attn_qkv and ffn_up (gate | up) matrices
        (
            "gemma3_text",
            {"hidden_size": 128, "num_attention_heads": 2},
        ),  # norms stored as 1 + w, a tied LM head
    ],
)
def test_a_file_of_each_family_loads_quantized_with_the_fp32_bits(family, extra, tmp_path, monkeypatch):
    from test_families import make

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    tok = make_tokenizer()
    hf = make(
        family,
        **{
            "hidden_size": 256,
            "intermediate_size": 512,
            "eos_token_id": tok.eos_token_id,
            "tie_word_embeddings": family.startswith("gemma"),
            **extra,
        },
    )
    path = write_tiny_gguf(
        tmp_path / f"{family}.gguf",
        hf,
        tok,
        {
            "attn_q": "Q4_1",
            "attn_k": "Q5_0",
            "attn_qkv": "Q4_1",
            "ffn_down": "Q6_K" if hf.config.intermediate_size % 256 == 0 else "Q4_0",
        },
    )
    fp32, quant = models.load(path, FP32, "cpu"), models.load(path, GGUF_EXACT, "cpu")
    assert fp32.model.config.model_type == family and isinstance(
        quant.model.layers[0].qkv, gguf_weights.QuantLinear
    )
    ids = torch.randint(0, 384, (150,), generator=torch.Generator().manual_seed(5))
    for chunk in (
        ids[:40],
        ids[40:140],
        ids[140:],
    ):  # fused kernels, a dense prefill past DENSE_ROWS, fused again
        assert torch.equal(fp32.model.extend(chunk), quant.model.extend(chunk))
    target = models.load(path, GGUF, "cpu")  # 8-bit activations: lossless against its own plain decoding
    # biases, q/k norms, Gemma's sandwich norms, GELU, its tied head: one native call
    assert target.model.stack is not None and target.model.stack.head is None
    assert_stack_is_per_op(target.model, ids)
    ctx = drafters.DrafterContext(target, GGUF)
    plain = drafters.build("none", ctx)
    repeats = PROMPTS[:2] + ["one two three one two three one two"]  # the last one has n-grams to find
    assert_lossless(
        target, plain, drafters.build("ngram", ctx), repeats, k=4, max_new_tokens=24, min_accepted=0
    )
    own = drafters.build(f"draft:{path}", ctx)  # the file drafting for itself: accepted
    assert_lossless(target, plain, own, PROMPTS[:2], k=4, max_new_tokens=24, min_accepted=20)


def test_the_tensor_reader_agrees_with_gguf_and_names_damaged_files(tiny_gguf, tmp_path):
    from gguf import GGUFReader

    arch, tensors = gguf_file.read(tiny_gguf)
    reference = GGUFReader(tiny_gguf).tensors
    assert arch == "llama" and set(tensors) == {t.name for t in reference}
    for t in reference:
        kind, raw = tensors[t.name]
        assert kind == t.tensor_type.name
        assert np.array_equal(
            np.asarray(raw).reshape(-1).view(np.uint8), np.asarray(t.data).reshape(-1).view(np.uint8)
        )
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(UserError, match="cannot read GGUF file .*bad magic"):
        gguf_file.read(broken)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(open(tiny_gguf, "rb").read()[:200])
    with pytest.raises(UserError, match="cannot read GGUF file"):
        gguf_file.read(truncated)


@needs_kernels
def test_auto_is_exact_where_fp32_tokens_are_promised(tiny_gguf):
    from specdecode import cli

    picked = {}
    for argv in (["generate", "x"], ["serve"], ["train", "data", "--out", "o"], ["bench"]):
        args = cli.parser().parse_args([*argv, "--target", tiny_gguf, "--device", "cpu"])
        cli.options.parse_precision(args)
        picked[argv[0] + (argv[1] if argv[0] == "train" else "")] = str(args.precision)
    # batched rows as single ones on every ISA's tiles: the server runs gguf too
    assert picked == {"generate": "gguf", "serve": "gguf", "traindata": "gguf-exact", "bench": "gguf"}
    assert kernels.rows_exact_int8()


@needs_kernels
def test_train_data_takes_the_target_at_gguf_and_refuses_bf16(tiny_gguf):
    """`train data --dtype gguf`: the precision users run, its batched rows a decoding step's bits."""
    from specdecode import cli
    from specdecode.train.cli import _load_target

    def args(dtype):
        argv = ["train", "data", "--out", "o", "--target", tiny_gguf, "--dtype", dtype]
        parsed = cli.parser().parse_args(argv)
        cli.options.parse_precision(parsed)
        return parsed

    assert _load_target(args("gguf"), generate_only=True).model.int8_activations
    with pytest.raises(UserError, match=r"fp32, gguf-exact or gguf \(--dtype bf16 given\)"):
        _load_target(args("bf16"), generate_only=True)


@needs_kernels
def test_a_head_trained_on_the_quantized_targets_features_serves_it_losslessly(
    tiny_gguf, pair, tmp_path, capsys
):
    from specdecode.cli import main
    from train_fixtures import make_data

    data_dir, store = make_data(pair[0], tmp_path / "data", max_new_tokens=24), tmp_path / "store"
    common = [
        "--data",
        str(data_dir),
        "--features",
        str(store),
        "--target",
        tiny_gguf,
        "--device",
        "cpu",
        "--steps",
        "4",
        "--vocab",
        "300",
        "--save-every",
        "10",
    ]
    assert main(["train", "eagle", *common, "--out", str(tmp_path / "fp32"), "--dtype", "fp32"]) == 0
    fp32_files = sorted(p.name for p in store.iterdir())
    assert main(["train", "eagle", *common, "--out", str(tmp_path / "exact"), "--dtype", "gguf-exact"]) == 0
    assert (
        sorted(p.name for p in store.iterdir()) == fp32_files
    )  # gguf-exact is fp32's bits: nothing recomputed
    assert main(["train", "eagle", *common, "--out", str(tmp_path / "gguf"), "--dtype", "gguf"]) == 0
    assert len(list(store.iterdir())) == 2 * len(
        fp32_files
    )  # int8 activations: a second feature set beside it
    config = json.loads((tmp_path / "gguf" / "config.json").read_text())
    assert config["train"]["features"] == "gguf"
    hidden = [
        torch.load(store / n)["hidden"][0]
        for n in sorted(p.name for p in store.iterdir())
        if n.endswith(".pt") and ".layers-" not in n
    ]
    assert len(hidden) == 2 and hidden[0].shape == hidden[1].shape and not torch.equal(hidden[0], hidden[1])

    target = models.load(tiny_gguf, GGUF, "cpu")
    ctx = drafters.DrafterContext(target, GGUF)
    plain, head = drafters.build("none", ctx), drafters.build(f"eagle:{tmp_path / 'gguf'}", ctx)
    packed = [m.linear for m in head.head.modules() if isinstance(m, layer.PackedLinear)]
    assert packed and all(isinstance(f, gguf_weights.QuantLinear) for f in packed)
    assert head.native is not None  # a draft step is one native call
    assert_lossless(target, plain, head, PROMPTS[:3], k=3, max_new_tokens=30)
    four = drafters.build(f"eagle:bits=4:{tmp_path / 'gguf'}", ctx)  # its linears at 4 bits: still exact
    assert {m.linear.parts[0].kind for m in four.head.modules() if isinstance(m, layer.PackedLinear)} == {
        "q4"
    }
    assert four.native is not None
    assert_lossless(target, plain, four, PROMPTS[:3], k=3, max_new_tokens=30)
    with pytest.raises(UserError, match="bits= is 4 or 8"):
        drafters.parse("eagle:bits=5")
    floats = models.load(tiny_gguf, FP32, "cpu")
    with pytest.raises(UserError, match="bits=4 needs a --dtype gguf target"):
        drafters.build(f"eagle:bits=4:{tmp_path / 'gguf'}", drafters.DrafterContext(floats, FP32))
    # the server's batched core: three rows at once, each with its fork of the head (the native stack shared)
    from specdecode.backends.batch_model import batched
    from test_batch_decoder import MAX_NEW, together

    ids = [target.tokenizer(p)["input_ids"] for p in PROMPTS[:3]]
    outputs, _ = together(batched(target.model, 3), [(p, head) for p in ids], 3)
    assert outputs == [generate(target, plain, p, max_new_tokens=MAX_NEW).token_ids for p in ids]

    capsys.readouterr()
    assert main(["train", "eagle", *common, "--out", str(tmp_path / "bad"), "--dtype", "fp16"]) == 2
    assert (
        "learns from the target in fp32, bf16, gguf, gguf-exact (--dtype fp16 given)"
        in capsys.readouterr().err
    )
    assert main(["train", "eagle", *common, "--out", str(tmp_path / "bad"), "--dtype", "q4"]) == 2
    assert (
        "unknown dtype 'q4'; choose one of fp32, bf16, fp16, gguf, gguf-exact or auto"
        in capsys.readouterr().err
    )


@needs_tiles
def test_a_distilled_draft_beside_an_int8_target_runs_on_its_int8_stack(tiny_gguf, pair, tmp_path):
    from specdecode.train import draft
    from train_fixtures import make_data

    data_dir = make_data(pair[0], tmp_path / "data", max_new_tokens=24)
    draft.train(
        pair[0], data_dir, tmp_path / "draft", Schedule(steps=3), batch_tokens=64, vocab=200, window=32
    )
    target = models.load(tiny_gguf, GGUF, "cpu")
    ctx = drafters.DrafterContext(target, GGUF)
    plain, drafter = drafters.build("none", ctx), drafters.build(f"draft:{tmp_path / 'draft'}", ctx)
    model = drafter.model
    assert model.int8_activations and model.stack is not None
    assert all(
        isinstance(lin, gguf_weights.QuantLinear) and lin.interleaved
        for lin in (model.layers[0].qkv, model.lm_head)
    )
    _, drafted = assert_lossless(target, plain, drafter, PROMPTS[:3], k=3, max_new_tokens=30)
    assert drafted > 0


def test_quantize_q8_rounds_each_16_weights_to_their_scale():
    w = torch.randn(6, 64, generator=torch.Generator().manual_seed(5))
    w[0, :16] = 0.0  # an all-zero 16: scale 0, quants 0
    m = gguf_repack.quantize_q8(w)
    assert m.kind == "q8" and m.shape == (6, 64) and m.quants.dtype == torch.int8
    scale = w.view(6, 4, 16).abs().amax(-1, keepdim=True) / 127
    err = (m.dequantize() - w).view(6, 4, 16).abs()
    assert (err <= scale / 2 + 1e-6).all() and torch.equal(m.dequantize()[0, :16], torch.zeros(16))
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_repack.quantize_q8(torch.randn(4, 48))


def test_quantize_q4_rounds_each_32_weights_to_15_steps_above_their_minimum():
    w = torch.randn(6, 64, generator=torch.Generator().manual_seed(7))
    w[1, 32:] = 0.25  # a constant block: step 0, every weight its minimum
    m = gguf_repack.quantize_q4(w)
    assert m.kind == "q4" and m.shape == (6, 64) and m.quants.shape == (6, 32)
    blocks = w.view(6, 2, 32)
    step = (blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True)) / 15
    err = (m.dequantize() - w).view(6, 2, 32).abs()
    assert (err <= step / 2 + 1e-6).all() and torch.equal(m.dequantize()[1, 32:], w[1, 32:])
    assert torch.equal(m.dequantize().view(6, 2, 32).amin(-1), blocks.amin(-1))  # the minimum is exact
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_repack.quantize_q4(torch.randn(4, 48))


@needs_tiles
def test_a_drafter_head_beside_an_int8_target_takes_the_targets_int8_path():
    g = torch.Generator().manual_seed(6)
    w, b, x = torch.randn(40, 64, generator=g), torch.randn(40, generator=g), torch.randn(3, 64, generator=g)
    int8 = layer.head_linear(w, ops, b, int8=True)
    assert isinstance(int8, gguf_weights.QuantLinear) and int8.interleaved
    ref = x @ w.T + b
    torch.testing.assert_close(int8(x), ref, rtol=0, atol=0.03 * float(ref.abs().max()))
    four = layer.head_linear(w, ops, b, int8=True, bits=4)  # Q4_1-style blocks, the same kernels
    assert isinstance(four, gguf_weights.QuantLinear) and four.interleaved
    q4 = x @ gguf_repack.quantize_q4(w).dequantize().T + b  # what its weights are, in float
    torch.testing.assert_close(four(x), q4, rtol=0, atol=0.03 * float(q4.abs().max()))
    assert float((four(x) - ref).abs().max()) > float((int8(x) - ref).abs().max())  # 4 bits: coarser
    assert isinstance(layer.head_linear(w, ops, b), layer.FusedLinear)  # beside a float target


@needs_kernels
def test_features_fed_in_short_calls_are_the_rows_decoding_computes(tiny_gguf, pair, tmp_path, monkeypatch):
    from specdecode.train import data, features
    from train_fixtures import make_data

    seq = data.read(make_data(pair[0], tmp_path / "data", max_new_tokens=24))[0]
    target = models.load(tiny_gguf, GGUF, "cpu").model
    monkeypatch.setattr(gguf_weights, "DENSE_ROWS", 2)  # calls of 3+ rows take the exact float32 GEMM
    whole = features.compute(target, [seq]).hidden[0]
    fed = features.compute(target, [seq], rows=2).hidden[0]  # the prompt, then the response 2 rows a call
    tokens, start = torch.tensor(seq.tokens), len(seq.prompt_ids)
    target.reset()
    served = [
        target.forward(tokens[:start], num_logits=1, layers=(-1,)).features
    ]  # prefill, then decode steps
    served += [
        target.forward(tokens[i : i + 1], num_logits=1, layers=(-1,)).features
        for i in range(start, len(tokens))
    ]
    assert torch.equal(fed, torch.cat(served).float())
    # one long call is what decoding computes: every forward is fused (the tile kernels)
    assert torch.equal(whole[start:], fed[start:])
    assert features.Source(target, GGUF, 4).key("fp") != features.Source(target, GGUF).key("fp") != "fp"
    assert features.Source(target, GGUF_EXACT).key("fp") == "fp"


def test_bench_runs_hf_peers_in_the_float_pass_of_a_mixed_dtype_run(tiny_gguf, tmp_path, capsys):
    from specdecode.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a b c a b c a b", "category": "code"}) + "\n")
    out = tmp_path / "r.json"
    argv = ["bench", "--target", tiny_gguf, "--prompts", str(prompts), "--drafters", "ngram", "--k", "2"]
    argv += ["--max-new-tokens", "6", "--threads", "1", "--peers", "hf", "--out", str(out)]
    assert main(argv + ["--dtype", "fp32,gguf"]) == 0, capsys.readouterr().err
    rows = [r for r in json.loads(out.read_text())["rows"] if r["category"] == "ALL"]
    ran = {dtype: {r["drafter"] for r in rows if r["dtype"] == dtype} for dtype in ("fp32", "gguf")}
    assert ran["fp32"] == ran["gguf"] | {"hf"} and len(ran["gguf"]) == 2  # none and the n-gram drafter
    peer = next(r for r in rows if r["drafter"] == "hf")
    assert peer["peer"] and peer["tokens"] > 0
    gguf = next(r for r in rows if r["dtype"] == "gguf" and r["drafter"] == "none")
    assert set(gguf["speedup_vs_peers"]) == {"fp32 hf"}  # our quantized run against the float peer
    assert main(argv + ["--dtype", "gguf"]) == 2  # no float pass: refused before loading anything
    assert "keeps none" in capsys.readouterr().err


@needs_tiles
def test_the_memory_estimate_counts_the_loaded_tiles_bytes(tiny_gguf, capsys):
    """`specdecode memory --dtype gguf`'s weights are the bytes the loaded model holds: every linear's
    tiles (scales and quants, q|k|v and gate|up fused), the LM head's, the norms in float32; the token
    embedding stays in the file's mapping but for the rows it keeps as floats, at most CACHED_ROWS."""
    from specdecode.cli import main
    from specdecode.decoding import memory

    m = models.load(tiny_gguf, GGUF, "cpu").model

    def held(lin) -> int:
        parts = [p for p in lin.parts if isinstance(p, gguf_weights.Interleaved)]
        assert len(parts) == len(lin.parts)  # every matrix of MIXED has a tile kernel
        return sum(p.scales.nbytes + p.quants.nbytes for p in parts)

    linears = [lin for layer in m.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    norms = [t for layer in m.layers for t in (layer.norm1, layer.norm2)] + [m.final_norm]
    loaded = sum(map(held, linears + [m.lm_head])) + sum(t.nbytes for t in norms)
    table = m.embedding.table
    table.cache.clear()
    table.rows(np.arange(7))  # a lookup of a few rows fills the cache: float32 rows, bounded
    vocab, hidden = table.shape
    cached = min(vocab, embedding.CACHED_ROWS) * hidden * 4
    assert sum(r.nbytes for r in table.cache.values()) == 7 * hidden * 4 <= cached
    loaded += cached
    assert memory.gguf_weight_bytes(tiny_gguf) == loaded
    main(["memory", "--target", str(tiny_gguf), "--dtype", "gguf", "--batch", "3", "--context", "300"])
    out = capsys.readouterr().out
    assert (
        f"weights (tile layout; the token embedding stays in the file's mapping): {memory.fmt(loaded)}" in out
    )
    assert main(["memory", "--target", str(tiny_gguf).rsplit("/", 1)[0], "--dtype", "gguf"]) == 2
    assert "needs a GGUF file" in capsys.readouterr().err

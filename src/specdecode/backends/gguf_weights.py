"""GGUF weights kept quantized (`--dtype gguf`, `gguf-exact`): FastLlama's matmuls read the file's blocks.

Each block format is repacked once at load into one of two layouts, per block of 32 weights along a row:
- q4: float32 scale s and offset o, 16 bytes of nibbles (weight i low, weight i + 16 high);
  w = q * s + o. Q4_0 (s = d, o = -8 d), Q4_1 (s = d, o = m), Q4_K (s = d * sc, o = -dmin * m).
- q8: a float32 scale per 16 weights and 32 signed bytes; w = q * s. Q8_0 (s = d), Q5_0 (s = d,
  q - 16), Q6_K (s = d * sc, q - 32).
`gguf-exact` (kernels.cpp linear_q4/q8) dequantizes a block in registers: every product and sum named
there is exact in float32 (at most 21 significant bits) or rounded once exactly as ggml and the
`gguf` package round it, so the kernels compute with the very float32 values of the dequantized
model and give the bits of `--dtype fp32` on the same file. `gguf` (kernels_i8.cpp) quantizes each
activation row to 8 bits per block instead and forms integer dot products, llama.cpp's design:
faster, not equal to fp32. Other types (F32, F16, BF16, Q5_1, Q2_K, Q3_K, Q5_K, ...) are dequantized
by the `gguf` package into float32 rows for the fp32 kernel; a type the package cannot read is an
error naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from specdecode.backends.kernels import DENSE_ROWS
from specdecode.errors import UserError


@dataclass
class QuantMatrix:
    """[N, K] weights in a kernel layout: kind "q4" (scales [N, K/32, 2] = (s, o), quants uint8
    [N, K/2]) or "q8" (scales [N, K/32, 2] = per-16 s, quants int8 [N, K]). factors [N, K/256, 2]
    float32, or None: for K-quants, each super-block's two factors (q4: d, -dmin; q8: d, d) of which
    its blocks' scales are small-integer multiples (Interleaved keeps them factored)."""

    kind: str
    scales: torch.Tensor
    quants: torch.Tensor
    factors: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.quants.shape[0], self.scales.shape[1] * 32

    def rows(self, index: torch.Tensor) -> QuantMatrix:
        """The rows `index` [R] (a permutation, or the draft vocabulary's LM-head rows)."""
        factors = None if self.factors is None else self.factors[index].contiguous()
        return QuantMatrix(
            self.kind, self.scales[index].contiguous(), self.quants[index].contiguous(), factors
        )

    def dequantize(self) -> torch.Tensor:
        """-> float32 [N, K], the values the kernels compute with (for tests and eager fallbacks)."""
        n, k = self.shape
        if self.kind == "q4":
            q = torch.stack([self.quants & 15, self.quants >> 4], dim=-1)  # [N, K/2, 2]
            q = q.view(n, k // 32, 16, 2).transpose(2, 3).reshape(n, k // 32, 32).float()
            return (q * self.scales[..., :1] + self.scales[..., 1:]).view(n, k)
        q = self.quants.view(n, k // 16, 16).float()
        return (q * self.scales.reshape(n, k // 16, 1)).view(n, k)


@dataclass
class Interleaved:
    """A QuantMatrix of `n` rows in tile.h's layout: rows interleaved 16 at a time so one byte
    multiply-add serves 16 (AVX-512 VNNI), 8 (AVX2) or 4 (NEON) weight rows (scales [ceil(n/16),
    K/32, 2, 16], or 1 for "q8_0", or factored: uint8 [ceil(n/16), K/256, FACTORED] (_factored);
    quants uint8 [ceil(n/16), K/32, 64 bits]). Made and undone by the kernels (pack/unpack)."""

    kind: str
    scales: torch.Tensor
    quants: torch.Tensor
    n: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.quants.shape[1] * 32

    @classmethod
    def pack(cls, ops, m: QuantMatrix) -> Interleaved:
        """Scales as few bytes a step as hold them exactly: factored where the matrix has factors
        (K-quants: as the file keeps them), else float16 where that holds them, else float32. A "q8"
        matrix whose two scales are equal in every block (Q8_0: the default model's LM head) becomes
        "q8_0", one scale a block: half the scale bytes, and its kernel converts and scales one sum a
        block instead of two (linear_q8_0_tile)."""
        scales, quants = getattr(ops, f"pack_{m.kind}_tile")(m.scales, m.quants)
        return cls._compact(m.kind, scales, quants, m.shape[0], m.factors)

    @classmethod
    def pack_chunks(cls, ops, chunks: Iterator[QuantMatrix], n: int) -> Interleaved:
        """pack of the row-wise concatenation of `chunks` (n rows in all, each chunk a multiple of 16
        rows but the last) without ever holding it: each chunk is packed into its place (a 150k-row LM
        head costs its own size at load, not three times that)."""
        scales = quants = factors = None
        group = row = 0
        for m in chunks:
            s, q = getattr(ops, f"pack_{m.kind}_tile")(m.scales, m.quants)
            if scales is None:
                kind, groups = m.kind, -(-n // 16)
                scales, quants = s.new_empty((groups, *s.shape[1:])), q.new_empty((groups, *q.shape[1:]))
                if m.factors is not None:
                    factors = m.factors.new_empty((n, *m.factors.shape[1:]))
            scales[group : group + len(s)], quants[group : group + len(q)] = s, q
            if factors is not None:
                factors[row : row + len(m.quants)] = m.factors
            group, row = group + len(s), row + len(m.quants)
        return cls._compact(kind, scales, quants, n, factors)

    @classmethod
    def _compact(
        cls,
        kind: str,
        scales: torch.Tensor,
        quants: torch.Tensor,
        n: int,
        factors: torch.Tensor | None = None,
    ) -> Interleaved:
        packed = None if factors is None else _factored(scales, factors, n)
        if packed is not None:
            scales = packed
        else:
            if kind == "q8" and torch.equal(scales[:, :, 0], scales[:, :, 1]):
                kind, scales = "q8_0", scales[:, :, :1].contiguous()
            half = scales.half()
            if torch.equal(half.float(), scales):
                scales = half
        if kind != "q4":
            quants.view(len(quants), -1, 8, 16, 4)[-1, :, :, n - 16 * (len(quants) - 1) :] = (
                128  # padding: q = 0
            )
            for bits in (5, 6):  # every q in -16..15 (Q5_0), else in -32..31 (Q6_K): fewer bits
                lo, hi = 128 - (1 << (bits - 1)), 128 + (1 << (bits - 1))
                if all(bool(((q >= lo) & (q < hi)).all()) for q in _slices(quants)):
                    kind, quants = kind.replace("8", str(bits)), _narrow(quants, bits)
                    break
        return cls(kind, scales, quants, n)

    def unpack(self, ops) -> QuantMatrix:
        if self.kind == "q4":
            unpack, quants = ops.unpack_q4_tile, self.quants
        else:
            unpack, quants = (
                ops.unpack_q8_tile,
                _widen(self.quants, int(self.kind[1])) if self.kind[1] in "56" else self.quants,
            )
        scales, factors = self.scales, None
        if self.kind.endswith("_0"):  # both halves of a block the one scale
            scales = scales.expand(-1, -1, 2, -1).contiguous()
        elif scales.dtype == torch.uint8:
            scales, factors = _unfactored(scales, self.n)
        return QuantMatrix("q4" if self.kind == "q4" else "q8", *unpack(scales, quants, self.n), factors)


def _slices(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x's groups of 16 rows a ROWS_AT_ONCE rows at a time (views): conversions of a 150k-row LM head
    then hold temporaries of a slice, not of the head."""
    return x.split(ROWS_AT_ONCE // 16)


def _narrow(quants: torch.Tensor, bits: int) -> torch.Tensor:
    """Interleaved q8 bytes [groups, G, 512] (q + 128, every q in -2^(bits-1)..2^(bits-1) - 1; bits 5 or
    6) -> [groups, G, 64 bits] (tile.h): v = q + 2^(bits-1) as q4's nibble registers, then
    bits - 4 registers of v's high bits, register PER j + i's at bits (bits - 4) i of register j
    (PER = 8 / (bits - 4))."""
    h = bits - 4
    per = 8 // h
    out = quants.new_empty((*quants.shape[:2], 64 * bits))
    for q, o in zip(_slices(quants), _slices(out)):
        groups, g = q.shape[:2]
        v = q.view(groups, g, 8, 64) - (128 - (1 << (bits - 1)))  # [.., register t, lane byte]
        nibbles = (v[:, :, :4] & 15) | ((v[:, :, 4:] & 15) << 4)
        high = (v >> 4).view(groups, g, h, per, 64)  # register PER j + i -> bits h i of high register j
        packed = high[:, :, :, 0].clone()
        for i in range(1, per):
            packed |= high[:, :, :, i] << (h * i)
        o[:, :, :256] = nibbles.view(groups, g, 256)
        o[:, :, 256:] = packed.view(groups, g, 64 * h)
    return out


def _widen(quants: torch.Tensor, bits: int) -> torch.Tensor:
    """_narrow's inverse."""
    h = bits - 4
    per = 8 // h
    out = quants.new_empty((*quants.shape[:2], 512))
    shifts = torch.tensor([h * i for i in range(per)], dtype=torch.uint8).view(per, 1)
    for q, o in zip(_slices(quants), _slices(out)):
        groups, g = q.shape[:2]
        nibbles, packed = q[:, :, :256].view(groups, g, 4, 64), q[:, :, 256:].view(groups, g, h, 1, 64)
        high = ((packed >> shifts) & ((1 << h) - 1)).view(groups, g, 8, 64)  # register PER j + i
        o.view(groups, g, 8, 64)[:] = (torch.cat([nibbles & 15, nibbles >> 4], dim=2) | high << 4) + (
            128 - (1 << (bits - 1))
        )
    return out


# tile.h's factored scales: per group of 16 rows and super-block of 8 blocks, the two factors
# [2, 16] float16, then per block the two multipliers [8, 2, 16] int8 (a block's scale = factor x multiplier)
FACTOR_BYTES = 2 * 16 * 2
FACTORED = FACTOR_BYTES + 8 * 2 * 16  # tile::FACTORED


def _factored(scales: torch.Tensor, factors: torch.Tensor, n: int) -> torch.Tensor | None:
    """Interleaved float32 scales [groups, G, 2, 16] and factors [n, G/8, 2] -> uint8 [groups, G/8,
    FACTORED], or None when a scale is not exactly an int8 multiple of its factor in
    float16 (the kernel forms factor x multiplier in float32: the very value of `scales`)."""
    groups, g = scales.shape[:2]
    if g % 8 or scales.dtype != torch.float32 or scales.shape[2] != 2:
        return None
    f = torch.zeros(groups * 16, g // 8, 2)
    f[:n] = factors
    f = f.view(groups, 16, g // 8, 2).permute(0, 2, 3, 1).half().contiguous()  # [groups, S, 2, 16]
    out = torch.empty(groups, g // 8, FACTORED, dtype=torch.uint8)
    out[..., :FACTOR_BYTES] = f.view(groups, g // 8, -1).view(torch.uint8)
    for fs, ss, o in zip(_slices(f), _slices(scales), _slices(out)):
        per_block = fs.float().repeat_interleave(8, dim=1)  # [.., G, 2, 16]
        c = torch.where(per_block != 0, ss / per_block, torch.zeros(())).round().clamp(-128, 127)
        if not torch.equal(c * per_block, ss):
            return None
        o[..., FACTOR_BYTES:] = c.to(torch.int8).view(len(ss), g // 8, -1).view(torch.uint8)
    return out


def _unfactored(packed: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """_factored's bytes -> (float32 scales [groups, G, 2, 16], factors [n, G/8, 2])."""
    groups, s = packed.shape[:2]
    f = packed[..., :FACTOR_BYTES].contiguous().view(torch.float16).view(groups, s, 1, 2, 16).float()
    c = packed[..., FACTOR_BYTES:].contiguous().view(torch.int8).view(groups, s, 8, 2, 16).float()
    factors = f.view(groups, s, 2, 16).permute(0, 3, 1, 2).reshape(groups * 16, s, 2)[:n].contiguous()
    return (f * c).view(groups, s * 8, 2, 16), factors


def quantize_q8(weight: torch.Tensor) -> QuantMatrix:
    """[N, K] float weights (K a multiple of 32) -> a "q8" QuantMatrix: each weight an int8 of its 16's
    scale (max |w| / 127), rounded to nearest. For weights trained in float that run beside a GGUF
    target's (layer.head_linear: drafter heads)."""
    n, k = weight.shape
    if k % 32:
        raise ValueError(f"quantize_q8: {k} inputs is not a multiple of 32")
    w = weight.detach().float().reshape(n, k // 16, 16)
    s = w.abs().amax(-1, keepdim=True) / 127
    q = torch.where(s > 0, w / s.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    return QuantMatrix(
        "q8", s.reshape(n, k // 32, 2), q.round().clamp(-127, 127).to(torch.int8).reshape(n, k)
    )


def concat(matrices: list[QuantMatrix]) -> QuantMatrix | None:
    """Row-wise concatenation (fused q|k|v, gate|up), or None when the layouts differ."""
    if len({m.kind for m in matrices}) != 1 or len({m.shape[1] for m in matrices}) != 1:
        return None
    if len(matrices) == 1:
        return matrices[0]
    factors = None
    if all(m.factors is not None for m in matrices):
        factors = torch.cat([m.factors for m in matrices])
    return QuantMatrix(
        matrices[0].kind,
        torch.cat([m.scales for m in matrices]),
        torch.cat([m.quants for m in matrices]),
        factors,
    )


def _f16(b: np.ndarray) -> torch.Tensor:  # [..., 2] uint8 -> [...] float32
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32))


def _q4_0(blocks: np.ndarray) -> QuantMatrix:  # [N, G, 18]: d, 16 bytes of nibbles
    d = _f16(blocks[..., 0:2])
    return QuantMatrix(
        "q4", torch.stack([d, -8 * d], -1), torch.from_numpy(blocks[..., 2:].reshape(len(blocks), -1))
    )


def _q4_1(blocks: np.ndarray) -> QuantMatrix:  # [N, G, 20]: d, m, 16 bytes of nibbles
    so = torch.stack([_f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])], -1)
    return QuantMatrix("q4", so, torch.from_numpy(blocks[..., 4:].reshape(len(blocks), -1)))


def _q8_0(blocks: np.ndarray) -> QuantMatrix:  # [N, G, 34]: d, 32 int8
    d = _f16(blocks[..., 0:2])
    return QuantMatrix(
        "q8",
        torch.stack([d, d], -1),
        torch.from_numpy(blocks[..., 2:].reshape(len(blocks), -1).view(np.int8)),
    )


def _q5_0(blocks: np.ndarray) -> QuantMatrix:  # [N, G, 22]: d, 32 high bits, 16 bytes of low nibbles
    d = _f16(blocks[..., 0:2])
    high = np.unpackbits(np.ascontiguousarray(blocks[..., 2:6]), axis=-1, bitorder="little")  # [N, G, 32]
    low = np.concatenate([blocks[..., 6:] & 15, blocks[..., 6:] >> 4], axis=-1)  # weights 0..15, 16..31
    q = (low | (high << 4)).astype(np.int16) - 16
    return QuantMatrix(
        "q8", torch.stack([d, d], -1), torch.from_numpy(q.astype(np.int8).reshape(len(blocks), -1))
    )


def _nibbles(v: np.ndarray) -> np.ndarray:
    """v [..., 32] values 0..15 -> [..., 16] bytes, v[i] in the low nibble, v[i + 16] in the high."""
    return (v[..., :16] | (v[..., 16:] << 4)).astype(np.uint8)


def _q4_k(
    blocks: np.ndarray,
) -> QuantMatrix:  # [N, S, 144] super-blocks of 256: d, dmin, 12 scale bytes, 128 qs
    n, nsb = blocks.shape[:2]
    d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])  # [N, S]
    sb = blocks[..., 4:16].astype(np.int32)  # 8 six-bit scales and mins (ggml's get_scale_min_k4)
    sc = np.concatenate([sb[..., 0:4] & 63, (sb[..., 8:12] & 15) | ((sb[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([sb[..., 4:8] & 63, (sb[..., 8:12] >> 4) | ((sb[..., 4:8] >> 6) << 4)], -1)
    qs = blocks[..., 16:].reshape(n, nsb, 4, 32)  # sub-blocks 2p (low nibbles) and 2p + 1 (high)
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(n, nsb * 8, 32)
    s = d[..., None] * torch.from_numpy(sc.astype(np.float32))
    o = -(dmin[..., None] * torch.from_numpy(mn.astype(np.float32)))
    so = torch.stack([s, o], -1).reshape(n, nsb * 8, 2)
    return QuantMatrix("q4", so, torch.from_numpy(_nibbles(q).reshape(n, -1)), torch.stack([d, -dmin], -1))


def _q6_k(
    blocks: np.ndarray,
) -> QuantMatrix:  # [N, S, 210] super-blocks of 256: ql 128, qh 64, scales 16 int8, d
    n, nsb = blocks.shape[:2]
    ql = blocks[..., 0:128].reshape(n, nsb, 2, 64)
    qh = blocks[..., 128:192].reshape(n, nsb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    low = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)
    q = (low | ((qh & 3) << 4)).astype(np.int16) - 32  # [N, S, 2, 4, 32]: element 128 h + 32 t + l
    sc = torch.from_numpy(
        blocks[..., 192:208].copy().view(np.int8).astype(np.float32)
    )  # per 16 elements, in order
    d = _f16(blocks[..., 208:210])
    s = (d[..., None] * sc).reshape(n, nsb * 8, 2)
    return QuantMatrix("q8", s, torch.from_numpy(q.astype(np.int8).reshape(n, -1)), torch.stack([d, d], -1))


# GGML type name -> (bytes per block, weights per block, repack of [N, blocks, bytes])
FORMATS = {
    "Q4_0": (18, 32, _q4_0),
    "Q4_1": (20, 32, _q4_1),
    "Q5_0": (22, 32, _q5_0),
    "Q8_0": (34, 32, _q8_0),
    "Q4_K": (144, 256, _q4_k),
    "Q6_K": (210, 256, _q6_k),
}


ROWS_AT_ONCE = 8192  # rows a repack or a dequantization converts at a time (bounds their temporaries)


def repack_chunks(type_name: str, raw: np.ndarray, name: str = "tensor") -> Iterator[QuantMatrix]:
    """repack of a tensor of a kernel format (FORMATS) in slices of ROWS_AT_ONCE rows, one at a time:
    the repacks' integer temporaries stay small beside a 150k-row LM head."""
    size, _, fn = FORMATS[type_name]
    raw = np.ascontiguousarray(raw).reshape(raw.shape[0], -1)
    if raw.shape[1] % size:
        raise UserError(
            f"GGUF tensor {name}: {raw.shape[1]} bytes per row is not a whole number of {type_name} blocks"
        )
    blocks = raw.reshape(raw.shape[0], raw.shape[1] // size, size)
    for i in range(0, len(blocks), ROWS_AT_ONCE):
        yield fn(blocks[i : i + ROWS_AT_ONCE])


def repack(type_name: str, raw: np.ndarray, name: str = "tensor") -> QuantMatrix | torch.Tensor:
    """A GGUF tensor's data (rows of raw blocks, or plain values) -> a QuantMatrix, or float32 [N, K]
    dequantized by the `gguf` package for types without a kernel."""
    if type_name in FORMATS:
        out, row = None, 0
        for m in repack_chunks(type_name, raw, name):  # each slice into its place: no second copy
            if out is None:
                n = raw.shape[0]
                scales, quants = (
                    m.scales.new_empty((n, *m.scales.shape[1:])),
                    m.quants.new_empty((n, *m.quants.shape[1:])),
                )
                factors = None if m.factors is None else m.factors.new_empty((n, *m.factors.shape[1:]))
                out = QuantMatrix(m.kind, scales, quants, factors)
            out.scales[row : row + len(m.scales)], out.quants[row : row + len(m.quants)] = m.scales, m.quants
            if out.factors is not None:
                out.factors[row : row + len(m.quants)] = m.factors
            row += len(m.quants)
        return out
    from gguf import GGMLQuantizationType, quants

    try:
        qtype = GGMLQuantizationType[type_name]
        return torch.from_numpy(np.ascontiguousarray(quants.dequantize(raw, qtype), dtype=np.float32))
    except (KeyError, NotImplementedError) as e:
        raise UserError(
            f"GGUF tensor {name} has type {type_name}, which neither specdecode's kernels nor the "
            f"gguf package can read"
        ) from e


class QuantLinear:
    """y = x W^T for GGUF weights: one kernel call per run of matrices sharing a layout (fused
    q|k|v and gate|up become one call when their types agree), float32 rows for the rest. More
    than kernels.DENSE_ROWS rows of x: each matrix dequantized (to the kernels' exact values) into
    torch's dense GEMM, the float32 model's route; except with 8-bit activations, whose interleaved
    tile kernels take calls of any size, so that every row gets the same bits in any call."""

    def __init__(
        self,
        ops,
        matrices: list[QuantMatrix | torch.Tensor],
        int8_activations: bool = False,
        bias: torch.Tensor | None = None,
    ):
        """int8_activations: each row of x quantized to 8 bits per block of 32 (tile.h) instead of
        float32 x dequantized weights; bias [out_features] added to the outputs (Qwen2's
        q|k|v)."""
        self.ops, self.parts, self.int8_activations = ops, [], int8_activations
        self.bias = None if bias is None else bias.detach().float().clone()
        self.dequantizers = {"q4": ops.dequantize_q4, "q8": ops.dequantize_q8}
        self.kernels = {"q4": ops.linear_q4, "q8": ops.linear_q8}  # float32 x, exact dequantization
        self.tiles = {
            "q4": ops.linear_q4_tile,
            "q8": ops.linear_q8_tile,
            "q8_0": ops.linear_q8_0_tile,
            "q6": ops.linear_q6_tile,
            "q6_0": ops.linear_q6_0_tile,
            "q5": ops.linear_q5_tile,
            "q5_0": ops.linear_q5_0_tile,
        }
        for m in matrices:
            if self.parts and isinstance(m, QuantMatrix) and isinstance(self.parts[-1], QuantMatrix):
                joined = concat([self.parts[-1], m])
                if joined is not None:
                    self.parts[-1] = joined
                    continue
            self.parts.append(m)
        # 8-bit activations: the interleaved tile layout (kernels_tile.cpp, this CPU's microkernel) for
        # every call (a prefill too: its rows then get the bits of decoding steps, and no dense GEMM)
        self.interleaved = int8_activations
        if self.interleaved:
            self.parts = [Interleaved.pack(ops, p) if isinstance(p, QuantMatrix) else p for p in self.parts]
        self.out_features = sum(p.shape[0] for p in self.parts)
        one = self.parts[0] if len(self.parts) == 1 and isinstance(self.parts[0], Interleaved) else None
        # the decode path's call, [n, K] float32 in: straight to the kernel, no Python layers between
        self.direct = (
            partial(self.tiles[one.kind], scales=one.scales, quants=one.quants, N=one.n)
            if one and self.bias is None
            else None
        )

    def interleaved_parts(
        self, with_bias: bool = False
    ) -> list[tuple[str, torch.Tensor, torch.Tensor, int]] | None:
        """(kind, scales, quants, rows) of each part when all are interleaved (for stack.cpp), else None;
        a linear with a bias only when the caller adds it (with_bias: the stack's q|k|v biases)."""
        if self.bias is not None and not with_bias:
            return None
        if not all(isinstance(p, Interleaved) for p in self.parts):
            return None
        return [(p.kind, p.scales, p.quants, p.n) for p in self.parts]

    def dequantize(self) -> torch.Tensor:
        """-> float32 [out_features, K]: the weights as the kernels see them, equal to the `gguf`
        package's dequantization (for readers of a float head: the distilled draft, the trainers)."""
        parts = [p.unpack(self.ops) if isinstance(p, Interleaved) else p for p in self.parts]
        return torch.cat([p.dequantize() if isinstance(p, QuantMatrix) else p.float() for p in parts])

    def rows(self, index: torch.Tensor) -> QuantLinear:
        """The output rows `index` (a draft vocabulary's LM-head rows), still quantized."""
        if len(self.parts) != 1:
            raise ValueError("rows() of a QuantLinear made of several matrices")
        part = self.parts[0]
        if isinstance(part, Interleaved):
            part = part.unpack(self.ops)
        picked = part.rows(index) if isinstance(part, QuantMatrix) else part[index].contiguous()
        bias = None if self.bias is None else self.bias[index]
        return QuantLinear(self.ops, [picked], self.int8_activations, bias)

    def _one(self, x: torch.Tensor, part, bias: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] > DENSE_ROWS and not self.interleaved:  # the exact float32 weights, dense GEMM
            dense = (
                part
                if isinstance(part, torch.Tensor)
                else self.dequantizers[part.kind](part.scales, part.quants)
            )
            return torch.nn.functional.linear(x, dense, bias)  # as the float32 model's FusedLinear
        if isinstance(part, torch.Tensor):
            y = self.ops.linear(x, part)
        elif isinstance(part, Interleaved):
            y = self.tiles[part.kind](x, part.scales, part.quants, part.n)
        else:
            y = self.kernels[part.kind](x, part.scales, part.quants)
        if bias is not None:
            y += bias
        return y

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., K] -> [..., out_features] float32
        if self.direct is not None and x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():
            return self.direct(x)
        flat = x.reshape(-1, x.shape[-1]).float().contiguous()
        sizes = [p.shape[0] for p in self.parts]
        biases = [None] * len(sizes) if self.bias is None else self.bias.split(sizes)
        outs = [self._one(flat, p, b) for p, b in zip(self.parts, biases)]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y.view(*x.shape[:-1], self.out_features)


_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9


def dequantized(type_name: str, raw: np.ndarray, name: str = "tensor") -> torch.Tensor:
    """Rows of a GGUF tensor -> float32 [N, K], the values the kernels compute with (the one
    dequantization of looked-up embedding rows and of the float tensors a skeleton holds)."""
    m = repack(type_name, raw, name)
    return m if isinstance(m, torch.Tensor) else m.dequantize()


def read(path: Path) -> tuple[str, dict[str, tuple[str, np.ndarray]]]:
    """-> (architecture, tensor name -> (GGML type name, its rows of raw bytes, mapped from the file)).
    A small reader of the GGUF layout: gguf.GGUFReader builds every metadata value as numpy views,
    6 s for the default model's 49k-token vocabulary, where skipping them takes milliseconds."""
    import mmap
    import struct

    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if buf[:4] != b"GGUF":
            raise ValueError("not a GGUF file (bad magic)")
        pos = 8
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos)
        pos += 16

        def string(pos: int) -> tuple[str, int]:
            (n,) = struct.unpack_from("<Q", buf, pos)
            return bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", "replace"), pos + 8 + n

        def skip(kind: int, pos: int) -> int:
            if kind in _SCALARS:
                return pos + _SCALARS[kind]
            if kind == _STRING:
                return string(pos)[1]
            if kind != _ARRAY:
                raise ValueError(f"unknown metadata value type {kind}")
            elem, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if elem in _SCALARS:
                return pos + count * _SCALARS[elem]
            for _ in range(count):
                pos = skip(elem, pos)
            return pos

        meta = {}
        for _ in range(n_kv):
            key, pos = string(pos)
            (kind,) = struct.unpack_from("<I", buf, pos)
            if kind == _STRING:
                meta[key], pos = string(pos + 4)
            elif key == "general.alignment":
                (meta[key],) = struct.unpack_from("<I", buf, pos + 4)
                pos += 8
            else:
                pos = skip(kind, pos + 4)
        infos = []
        for _ in range(n_tensors):
            name, pos = string(pos)
            (dims,) = struct.unpack_from("<I", buf, pos)
            shape = struct.unpack_from(f"<{dims}Q", buf, pos + 4)
            kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 12
            infos.append((name, shape, GGMLQuantizationType(kind), offset))
        align = meta.get("general.alignment", 32)
        start = -(-pos // align) * align
        tensors = {}
        for name, shape, qtype, offset in infos:
            per_block, block_bytes = GGML_QUANT_SIZES[qtype]
            rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            row_bytes = shape[0] // per_block * block_bytes
            raw = np.frombuffer(buf, np.uint8, rows * row_bytes, start + offset).reshape(rows, row_bytes)
            if qtype.name in ("F32", "F16", "BF16"):  # plain values: as the gguf package gives them
                raw = raw.view({"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[qtype.name])
            tensors[name] = (qtype.name, raw)
        return meta["general.architecture"], tensors
    except (ValueError, KeyError, struct.error) as e:
        raise UserError(f"cannot read GGUF file {path}: {e}") from e


def drop_pages(tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Unmap the pages of read()'s file mapping that were touched so far (they stay in the page cache;
    a later read faults them back in): repacking then holds at most a layer's file pages resident."""
    import mmap

    base = next(iter(tensors.values()))[1] if tensors else None
    while isinstance(base, np.ndarray):
        base = base.base
    base = base.obj if isinstance(base, memoryview) else base  # np.frombuffer's view of the mapping
    if isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)

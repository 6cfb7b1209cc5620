"""GGUF weights kept quantized (`--dtype gguf`, `gguf-exact`): FastLlama's matmuls read the file's blocks,
repacked (gguf_repack.py) from the file's mapping (gguf_file.py).

`gguf-exact` (kernels.cpp linear_q4/q8) dequantizes a q4/q8 block in registers to the very float32
values of the dequantized model and gives the bits of `--dtype fp32` on the same file. `gguf` quantizes
each activation row to 8 bits per block instead and forms integer dot products on the interleaved
tile layout (Interleaved; tile.h, a microkernel per ISA), llama.cpp's design: faster, not equal to
fp32. QuantLinear is the linear both run through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch

from specdecode.backends.gguf_repack import ROWS_AT_ONCE, QuantMatrix, concat
from specdecode.backends.kernels import DENSE_ROWS


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
    def pack_chunks(cls, ops, chunks: Callable[[], Iterator[QuantMatrix]], n: int) -> Interleaved:
        """pack of the row-wise concatenation of the matrices chunks() yields (n rows in all, each
        chunk a multiple of 16 rows but the last) without ever holding it unpacked: each chunk is
        packed and compacted (_compact: its scale and bit formats) into its place, so that a 150k-row
        LM head costs its compact size at load plus one chunk's temporaries. Should a chunk compact to
        another format than the first (its scales not float16-exact where the first's are, say), the
        whole is packed again at the widest format, as one matrix would be."""
        scales = quants = None
        form = None
        group = 0
        for m in chunks():
            s, q = getattr(ops, f"pack_{m.kind}_tile")(m.scales, m.quants)
            c = cls._compact(m.kind, s, q, len(m.quants), m.factors)
            if form is None:
                form, groups = (c.kind, c.scales.dtype, c.scales.shape[1:]), -(-n // 16)
                scales = c.scales.new_empty((groups, *c.scales.shape[1:]))
                quants = c.quants.new_empty((groups, *c.quants.shape[1:]))
            elif (c.kind, c.scales.dtype, c.scales.shape[1:]) != form:
                return cls._pack_whole(ops, chunks(), n)
            scales[group : group + len(c.scales)], quants[group : group + len(c.quants)] = c.scales, c.quants
            group += len(c.scales)
        return cls(form[0], scales, quants, n)

    @classmethod
    def _pack_whole(cls, ops, chunks: Iterator[QuantMatrix], n: int) -> Interleaved:
        """pack_chunks holding the whole matrix at the chunks' own width before compacting it once."""
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

    def rows(self, ops, index: torch.Tensor) -> QuantMatrix:
        """The rows `index` [R] unpacked (unpack(ops).rows(index)), ROWS_AT_ONCE rows at a time: a
        draft vocabulary's rows of a 150k-row LM head then take a slice's temporaries, not the head's
        (the 1.5B's unpacked whole added 465 MB at its peak)."""
        lo, parts, where = 0, [], []
        for scales, quants in zip(_slices(self.scales), _slices(self.quants)):
            hi = min(self.n, lo + 16 * len(quants))
            inside = ((index >= lo) & (index < hi)).nonzero().flatten()
            if len(inside):
                parts.append(
                    Interleaved(self.kind, scales, quants, hi - lo).unpack(ops).rows(index[inside] - lo)
                )
                where.append(inside)
            lo = hi
        return concat(parts).rows(torch.cat(where).argsort())

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
            picked = part.rows(self.ops, index)
        else:
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

"""GGUF block formats repacked into the kernels' two row layouts (QuantMatrix), per block of 32 weights
along a row:
- q4: float32 scale s and offset o, 16 bytes of nibbles (weight i low, weight i + 16 high);
  w = q * s + o. Q4_0 (s = d, o = -8 d), Q4_1 (s = d, o = m), Q4_K (s = d * sc, o = -dmin * m).
- q8: a float32 scale per 16 weights and 32 signed bytes; w = q * s. Q8_0 (s = d), Q5_0 (s = d,
  q - 16), Q6_K (s = d * sc, q - 32).
Every product and sum named here is exact in float32 (at most 21 significant bits) or rounded once
exactly as ggml and the `gguf` package round it. Other types (F32, F16, BF16, Q5_1, Q2_K, Q3_K,
Q5_K, ...) are dequantized by the `gguf` package into float32 rows; a type the package cannot read is
an error naming it. The file's reader is gguf_file.py; the kernels' layouts and QuantLinear
gguf_weights.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

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


def quantize_q8(weight: torch.Tensor) -> QuantMatrix:
    """[N, K] float weights (K a multiple of 32) -> a "q8" QuantMatrix: each weight an int8 of its 16's
    scale (max |w| / 127), rounded to nearest. For weights trained in float that run beside a GGUF
    target's (layer.head_linear: drafter heads)."""
    n, k = weight.shape
    if k % 32:
        raise ValueError(f"quantize_q8: {k} inputs is not a multiple of 32")
    scales = torch.empty(n, k // 32, 2, device=weight.device)
    quants = torch.empty(n, k, dtype=torch.int8, device=weight.device)
    for i in range(0, n, 1024):  # rows a slice at a time: float temporaries of a slice, not the matrix
        rows = slice(i, i + 1024)
        w = weight[rows].detach().float().reshape(-1, k // 16, 16)
        s = w.abs().amax(-1, keepdim=True) / 127
        q = torch.where(s > 0, w / s.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
        scales[rows] = s.reshape(-1, k // 32, 2)
        quants[rows] = q.round().clamp(-127, 127).to(torch.int8).reshape(-1, k)
    return QuantMatrix("q8", scales, quants)


def quantize_q4(weight: torch.Tensor) -> QuantMatrix:
    """[N, K] float weights (K a multiple of 32) -> a "q4" QuantMatrix as Q4_1 lays it out: each block
    of 32 weights as 4-bit steps s = (max - min) / 15 above its minimum o, rounded to nearest (within
    s / 2 of the weight). For heads that run beside a GGUF target at 4 bits (`eagle:bits=4`)."""
    n, k = weight.shape
    if k % 32:
        raise ValueError(f"quantize_q4: {k} inputs is not a multiple of 32")
    scales = torch.empty(n, k // 32, 2)
    quants = torch.empty(n, k // 2, dtype=torch.uint8)
    for i in range(0, n, 1024):  # a slice of rows at a time, as quantize_q8
        rows = slice(i, i + 1024)
        w = weight[rows].detach().float().cpu().reshape(-1, k // 32, 32)
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        s = (high - low) / 15
        q = torch.where(s > 0, (w - low) / s.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
        q = q.round().clamp(0, 15).to(torch.uint8)
        scales[rows] = torch.cat([s, low], -1)
        quants[rows] = (q[..., :16] | (q[..., 16:] << 4)).reshape(-1, k // 2)
    return QuantMatrix("q4", scales, quants)


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


def dequantized(type_name: str, raw: np.ndarray, name: str = "tensor") -> torch.Tensor:
    """Rows of a GGUF tensor -> float32 [N, K], the values the kernels compute with (the one
    dequantization of looked-up embedding rows and of the float tensors a skeleton holds)."""
    m = repack(type_name, raw, name)
    return m if isinstance(m, torch.Tensor) else m.dequantize()

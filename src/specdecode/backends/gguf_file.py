"""A GGUF file's tensors, mapped rather than read: a small reader of the GGUF layout (`read`: the
architecture and each tensor's type and rows of raw bytes) and `drop_pages`, which lets the kernel
drop a repacked tensor's file pages. The block formats are gguf_repack.py's; the kernels' layouts
gguf_weights.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specdecode.errors import UserError

_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes


_STRING, _ARRAY = 8, 9


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

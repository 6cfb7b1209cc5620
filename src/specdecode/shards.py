"""Training sequences in compact, checksummed shard files.

A shard `shard-NNNNN.sds` holds a few hundred sequences:

    b"SDSHARD1" | header length (4 bytes, little endian) | header (JSON) | zlib(token ids)

The header names the target the responses came from (`checkpoint.describe`: name and weight
fingerprint), the id dtype (uint16 when every id fits, else uint32), the CRC-32 of the compressed
body, and per sequence its id, category, source and the number of prompt and response ids. The body
is every sequence's prompt ids then response ids, concatenated. Shards are written to a temporary
file and renamed, so a killed writer leaves whole shards only; an existing shard is never
overwritten. A file that is truncated, fails its CRC or comes from another target is a UserError
naming the file.
"""

from __future__ import annotations

import json
import sys
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

from specdecode.errors import UserError
from specdecode.files import write_atomic

MAGIC = b"SDSHARD1"
SUFFIX = ".sds"
TYPECODES = {"uint16": "H", "uint32": "I"}  # array typecodes (I is 4 bytes on every platform we run on)


def _pack(ids: list[int], dtype: str) -> bytes:
    a = array(TYPECODES[dtype], ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def _unpack(raw: bytes, dtype: str) -> list[int]:
    a = array(TYPECODES[dtype])
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


@dataclass
class Record:
    """One training sequence of a shard: a prompt's ids and the response `source` gave to it."""

    id: str
    category: str
    prompt_ids: list[int]
    response_ids: list[int]
    source: str = "target"

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def write(path: str | Path, seqs: list[Record], target: dict) -> None:
    """seqs -> a new shard file at path (atomic; refuses to replace an existing file)."""
    path = Path(path)
    if path.exists():
        raise UserError(f"shard {path} exists already; not overwriting it")
    ids = [t for s in seqs for t in s.prompt_ids + s.response_ids]
    if ids and (min(ids) < 0 or max(ids) >= 2**32):
        raise UserError(f"token ids out of range for a shard (min {min(ids)}, max {max(ids)})")
    dtype = "uint16" if not ids or max(ids) < 2**16 else "uint32"
    body = zlib.compress(_pack(ids, dtype), 6)
    header = json.dumps(
        {
            "target": target,
            "dtype": dtype,
            "crc32": zlib.crc32(body),
            "body_bytes": len(body),
            "sequences": [[s.id, s.category, s.source, len(s.prompt_ids), len(s.response_ids)] for s in seqs],
        }
    ).encode()
    data = MAGIC + len(header).to_bytes(4, "little") + header + body
    write_atomic(path, lambda tmp: Path(tmp).write_bytes(data), durable=True)


def read(path: str | Path, target: dict | None = None) -> list[Record]:
    """A shard file -> its sequences; target: the expected `checkpoint.describe` of the target (None:
    any)."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[: len(MAGIC)] != MAGIC or len(raw) < len(MAGIC) + 4:
        raise UserError(f"{path} is not a specdecode shard (bad magic)")
    n = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 4], "little")
    start = len(MAGIC) + 4
    try:
        header = json.loads(raw[start : start + n])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"shard {path}: unreadable header (truncated or corrupt)") from None
    body = raw[start + n :]
    if len(body) != header["body_bytes"] or zlib.crc32(body) != header["crc32"]:
        raise UserError(f"shard {path}: truncated or corrupt (CRC mismatch)")
    if target is not None and header["target"] != target:
        raise UserError(
            f"shard {path} holds responses of target {header['target'].get('name')!r} "
            f"(fingerprint {header['target'].get('fingerprint')}), not of {target.get('name')!r} "
            f"(fingerprint {target.get('fingerprint')})"
        )
    ids = _unpack(zlib.decompress(body), header["dtype"])
    seqs, at = [], 0
    for sid, category, source, n_prompt, n_response in header["sequences"]:
        seqs.append(
            Record(
                sid,
                category,
                ids[at : at + n_prompt],
                ids[at + n_prompt : at + n_prompt + n_response],
                source,
            )
        )
        at += n_prompt + n_response
    if at != len(ids):
        raise UserError(f"shard {path}: header and body disagree ({at} vs {len(ids)} ids)")
    return seqs


def target_of(path: str | Path) -> dict:
    """The target a shard's responses came from (header only)."""
    raw = Path(path).read_bytes()[: 1 << 20]
    n = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 4], "little")
    return json.loads(raw[len(MAGIC) + 4 : len(MAGIC) + 4 + n])["target"]


def paths(directory: str | Path) -> list[Path]:
    """The shard files of a directory, in the order they were written."""
    return sorted(Path(directory).glob(f"shard-*{SUFFIX}"))


def next_path(directory: str | Path, tag: str = "") -> Path:
    """The next shard file name; a tag (a parallel worker's) keeps workers sharing a directory apart."""
    existing = paths(directory)
    n = int(existing[-1].stem.split("-")[1]) + 1 if existing else 0
    return Path(directory) / f"shard-{n:05d}{'-' + tag if tag else ''}{SUFFIX}"


def read_all(directory: str | Path, target: dict | None = None) -> list[Record]:
    return [s for p in paths(directory) for s in read(p, target)]

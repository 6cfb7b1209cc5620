"""Files the package writes and caches, in one place: where derived files are cached (`cache_dir`,
`derived_dir`) and how any file or directory is written so that a reader sees the old one or the new
one, never half (`write_atomic`, `save_atomically`). Imports nothing of the package's: every layer may
use it."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """Where derived models, GGUF metadata and built kernels are cached ($SPECDECODE_CACHE or the
    user cache dir)."""
    import platformdirs

    return Path(os.environ.get("SPECDECODE_CACHE") or platformdirs.user_cache_dir("specdecode"))


def derived_dir(source: Path, folder: str) -> Path:
    """Where what is derived from the file `source` is cached: cache_dir()/folder/<stem>-<key>, the key
    naming the file's content (size, and its first, middle and last MiB), not its path: one model
    installed into many virtual environments is one entry, and a changed file gets a new one."""
    size = source.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    chunk = 1 << 20
    with open(source, "rb") as f:
        for offset in (0, max(0, size // 2 - chunk // 2), max(0, size - chunk)):
            f.seek(offset)
            digest.update(f.read(chunk))
    return cache_dir() / folder / f"{source.stem}-{digest.hexdigest()[:16]}"


def write_atomic(path: Path, write: Callable[[str], object], durable: bool = False) -> None:
    """write(tmp_path) fills a temporary file beside `path`, which then replaces `path` in one rename;
    durable: synced to disk first (a shard a later session resumes from). If write raises, `path` is
    untouched and the temporary file goes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_atomically(target: Path, write: Callable[[Path], object]) -> Path:
    """write(tmp) fills a temporary directory beside `target`, which then becomes `target` in one rename:
    readers see a complete directory or none (where another process got there first, its copy stays)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        write(tmp)
        os.replace(tmp, target)
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

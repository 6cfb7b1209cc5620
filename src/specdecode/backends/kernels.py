"""Builds and loads kernels.cpp, kernels_i8.cpp, kernels_vnni.cpp and attention.cpp (with tiles.h),
FastLlama's fused CPU ops, once per machine.

The extension is compiled on first use with the system C++ compiler (about 45 s here) into the
specdecode cache, under a name that covers the source, torch's version and the CPU's instruction
set (it is built with -march=native). Without a compiler, or if the build fails, `load()` says
why once on stderr and returns None: FastLlama then runs its eager PyTorch ops, which give the
same tokens, only slower.
"""

from __future__ import annotations

import fcntl
import hashlib
import platform
import sys
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch

SOURCES = [
    Path(__file__).with_name(f"{name}.cpp")
    for name in ("kernels", "kernels_i8", "kernels_vnni", "attention", "stack")
]
HEADERS = [
    Path(__file__).with_name(name)
    for name in ("tiles.h", "vecmath.h", "rowops.h", "vnni_tile.h", "attention_row.h", "checks.h")
]

# Products of more rows than this (a long prefill, a big batch) go to torch's dense GEMM (oneDNN/MKL)
# instead of the row-invariant kernels, which are slower at that size (docs/results/
# prefill_dense_zen3_2threads.json, docs/benchmarks.md). Decoding and verification
# (at most 64 rows, FastLlama's fused forward) stay in the kernels, so a row's bits there never
# depend on the others.
DENSE_ROWS = 64


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def cache_root() -> Path:
    from specdecode.backends.lm import cache_dir

    return cache_dir() / "kernels"


@cache
def load():
    """The compiled module (linear, add_rms_norm, silu_mul, attention), or None when it cannot be built."""
    from torch.utils import cpp_extension

    key = hashlib.sha256(
        b"".join(s.read_bytes() for s in SOURCES + HEADERS)
        + str(SOURCES[0].parent).encode()  # torch writes the sources' paths into the build: one per checkout
        + torch.__version__.encode()
        + _cpu_flags().encode()
    ).hexdigest()[:12]
    build = cache_root() / key
    try:
        build.mkdir(parents=True, exist_ok=True)
        with build_guard(build):
            return cpp_extension.load(
                name=f"specdecode_kernels_{key}",
                sources=[str(s) for s in SOURCES],
                build_directory=str(build),
                extra_cflags=["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=fast"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
    except Exception as e:  # no compiler, no ninja, an unwritable cache, a failed build: eager ops still work
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"specdecode: fused CPU kernels unavailable, using eager ops ({reason})", file=sys.stderr)
        return None


@contextmanager
def build_guard(build: Path):
    """Held while this process builds or loads the kernels in `build`: an advisory lock the OS drops
    when its holder dies. torch's cpp_extension waits forever on its own lock file, which a build
    killed mid-way (a stopped session, Ctrl-C at the first start, an OOM) leaves behind; with the
    guard held no live process of ours is building, so such a file is stale and goes."""
    with open(build / "builder.lock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # waits while another process builds, not after it died
        (build / "lock").unlink(missing_ok=True)
        yield


def rows_exact_int8() -> bool:
    """Whether `--dtype gguf` gives a row the same bits in any call on this machine (the AVX-512 VNNI
    kernels: every forward fused, no dense GEMM for long calls), so batched rows equal single ones."""
    ops = load()
    return ops is not None and ops.vnni_rows() > 0

"""Builds and loads kernels.cpp, kernels_tile.cpp, attention.cpp and stack.cpp (with their headers),
FastLlama's fused CPU ops, once per machine and instruction set.

The extension is compiled on first use with the system C++ compiler (1-7 minutes on 2 cores) into
the specdecode cache, under a name that covers the source, torch's version, the CPU and the
instruction set it is built for. That is the CPU's own (-march=native) unless SPECDECODE_ISA names
another (ISAS): `SPECDECODE_ISA=avx2` on an AVX-512 machine builds and runs every kernel as an
AVX2-only CPU would (tile.h's AVX2 microkernel, 256-bit attention), so one machine measures the
paths of others; an ISA this CPU cannot run is refused, naming the flags it lacks. SPECDECODE_PREFETCH
(auto, l1, l2) sets the cache the x86 microkernels ask weights ahead into; auto is L2 on Intel's cores,
L1 elsewhere (tile.h), and `machine()` records which. Without a compiler, or if the build fails,
`load()` says why once on stderr and returns None: FastLlama then runs its eager PyTorch ops, which
give the same tokens, only slower.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import sys
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import torch

from specdecode.errors import UserError
from specdecode.files import cache_dir

SOURCES = [
    Path(__file__).with_name(f"{name}.cpp") for name in ("kernels", "kernels_tile", "attention", "stack")
]
HEADERS = [
    Path(__file__).with_name(name)
    for name in (
        "tiles.h", "half.h", "vecmath.h", "rowops.h", "tile.h", "tile_ref.h", "tile_avx2.h", "tile_avx512.h",
        "tile_neon.h", "attention_row.h", "checks.h",
    )
]  # fmt: skip

# Products of more rows than this (a long prefill, a big batch) go to torch's dense GEMM (oneDNN/MKL)
# instead of the row-invariant kernels, which are slower at that size (docs/results/
# prefill_dense_zen3_2threads.json, docs/benchmarks.md). Decoding and verification
# (at most 64 rows, FastLlama's fused forward) stay in the kernels, so a row's bits there never
# depend on the others.
DENSE_ROWS = 64


# SPECDECODE_ISA -> (compiler flags, /proc/cpuinfo flags the CPU needs to run the build). Every x86
# choice keeps -mtune=native: the instructions are the ISA's, the scheduling this CPU's.
ISAS = {
    "native": (["-march=native"], set()),
    "avx512vnni": (
        ["-march=x86-64-v4", "-mavx512vnni", "-mtune=native"],
        {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
    ),
    "avxvnni": (["-march=x86-64-v3", "-mavxvnni", "-mtune=native"], {"avx2", "fma", "f16c", "avx_vnni"}),
    "avx2": (["-march=x86-64-v3", "-mtune=native"], {"avx2", "fma", "f16c"}),
    "i8mm": (["-march=armv8.2-a+dotprod+i8mm"], {"asimddp", "i8mm"}),
    "neon": (["-march=armv8.2-a+dotprod"], {"asimddp"}),
    "scalar": (
        ["-march=x86-64", "-mtune=native"] if platform.machine() == "x86_64" else ["-march=armv8-a"],
        set(),
    ),
}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def cpu_flags() -> set[str]:
    """The ISA extensions /proc/cpuinfo lists for this CPU (x86 `flags`, ARM `Features`)."""
    return set(_cpu_flags().partition(":")[2].split())


def requested_isa() -> str:
    """SPECDECODE_ISA (default native), checked against ISAS and this CPU's flags."""
    isa = os.environ.get("SPECDECODE_ISA", "native").strip().lower() or "native"
    if isa not in ISAS:
        raise UserError(f"SPECDECODE_ISA={isa}: unknown instruction set; one of {', '.join(ISAS)}")
    missing = sorted(ISAS[isa][1] - cpu_flags())
    if missing:
        raise UserError(f"SPECDECODE_ISA={isa}: this CPU cannot run it (it lacks {', '.join(missing)})")
    return isa


PREFETCH = ("auto", "l1", "l2")


def requested_prefetch() -> str:
    """SPECDECODE_PREFETCH (default auto: L2 on Intel's cores, L1 elsewhere), the cache the x86 tile
    microkernels ask the weights' lines ahead into (tile.h's ahead_into_l2, which reads it too)."""
    level = os.environ.get("SPECDECODE_PREFETCH", "auto").strip().lower() or "auto"
    if level not in PREFETCH:
        raise UserError(f"SPECDECODE_PREFETCH={level}: unknown cache level; one of {', '.join(PREFETCH)}")
    return level


def machine() -> dict:
    """The CPU (name, family/model, the ISA extensions the kernels care about) and the ISA the kernels
    are built for: what every result file records beside its figures."""
    info, flags = {}, cpu_flags()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if (
                key in ("model name", "cpu family", "model", "cpu MHz", "CPU implementer", "CPU part")
                and key not in info
            ):
                info[key] = value
    except OSError:
        pass
    extensions = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "avx_vnni", "asimddp", "i8mm")
    family, model = info.get("cpu family"), info.get("model")
    zen = {
        ("23", "1"): "Zen 1", ("23", "49"): "Zen 2", ("25", "1"): "Zen 3", ("25", "8"): "Zen 3",
        ("25", "33"): "Zen 3", ("25", "17"): "Zen 4", ("25", "97"): "Zen 4", ("26", "2"): "Zen 5",
    }  # fmt: skip
    label = info.get("model name", platform.processor() or "unknown CPU")
    if "AMD" in label and (family, model) in zen:
        label += f" ({zen[family, model]})"
    ops = load()
    return {
        "name": label,
        "family": family,
        "model": model,
        "isa": [f for f in extensions if f in flags],
        "mhz": float(info.get("cpu MHz", 0) or 0),
        "kernel_isa": requested_isa(),
        "tile_microkernel": ops.tile_isa() if ops is not None else None,
        "prefetch": ops.tile_prefetch() if ops is not None else None,
    }


def cache_root() -> Path:
    return cache_dir() / "kernels"


@cache
def load():
    """The compiled module (linear, add_rms_norm, silu_mul, attention), or None when it cannot be built."""
    from torch.utils import cpp_extension

    isa = requested_isa()
    # checked and written back in the one spelling tile.h reads when the module loads
    os.environ["SPECDECODE_PREFETCH"] = requested_prefetch()
    key = hashlib.sha256(
        b"".join(s.read_bytes() for s in SOURCES + HEADERS)
        + str(SOURCES[0].parent).encode()  # torch writes the sources' paths into the build: one per checkout
        + torch.__version__.encode()
        + _cpu_flags().encode()
        + isa.encode()
    ).hexdigest()[:12]
    build = cache_root() / key
    try:
        build.mkdir(parents=True, exist_ok=True)
        with build_guard(build):
            return cpp_extension.load(
                name=f"specdecode_kernels_{key}",
                sources=[str(s) for s in SOURCES],
                build_directory=str(build),
                extra_cflags=["-O3", *ISAS[isa][0], "-fopenmp", "-fno-math-errno", "-ffp-contract=fast"],
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
    """Whether `--dtype gguf` gives a row the same bits in any call on this machine (the tile kernels,
    on every ISA: every forward fused, no dense GEMM for long calls), so batched rows equal single
    ones; not without the compiled kernels."""
    return load() is not None

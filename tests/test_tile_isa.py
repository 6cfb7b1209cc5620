"""Every ISA's tile microkernel against the portable reference, bit for bit (tests/native/tile_check.cpp,
built without torch), and the float16 KV cache's rounding and reads (tests/native/attention_check.cpp):
for each x86 ISA this CPU can run (kernels.ISAS), and for ARM NEON (and ARM's scalar build)
cross-compiled and run under qemu-aarch64. CI installs the cross compiler and qemu-user
(.ci/run); elsewhere the ARM cases are skipped when they are missing. The x86 ISAs this CPU lacks
(AVX-512 VNNI, AVX-VNNI) are built against emulated intrinsics and run here (EMULATED_FLAGS). The ISA switch
(SPECDECODE_ISA) refuses names it does not know and ISAs this CPU cannot run."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from specdecode.backends import kernels
from specdecode.errors import UserError

HERE = Path(__file__).parent
SOURCE = HERE / "native" / "tile_check.cpp"
INCLUDE = Path(kernels.__file__).parent
X86 = platform.machine() == "x86_64"
CPU_FLAGS = kernels.cpu_flags()


def build_and_run(
    tmp_path: Path, compiler: str, flags: list[str], runner: list[str], source: Path = SOURCE, args=()
) -> str:
    exe = tmp_path / source.stem
    subprocess.run([compiler, "-O2", *flags, f"-I{INCLUDE}", str(source), "-o", str(exe)], check=True)
    done = subprocess.run([*runner, str(exe), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def runnable_x86_isas() -> list[str]:
    if not X86 or shutil.which("g++") is None:
        return []
    return [isa for isa in ("scalar", "avx2", "avxvnni", "avx512vnni") if kernels.ISAS[isa][1] <= CPU_FLAGS]


def assert_every_case_passed(out: str) -> None:
    """418 cases a way through the microkernel: AVX2 and AVX-VNNI builds run them both ways of
    tile_avx2.h's group_tile (sets of rows, or by halves from a few rows as on AMD's cores)."""
    two_ways = " avx2," in out.splitlines()[0] or " avxvnni," in out.splitlines()[0]
    assert out.count("halves_sooner ") == (2 if two_ways else 0)
    assert f"{418 * (2 if two_ways else 1)} passed, 0 failed" in out


@pytest.mark.parametrize("isa", runnable_x86_isas())
def test_the_microkernel_of_each_isa_this_cpu_runs_has_the_references_bits(isa, tmp_path):
    out = build_and_run(tmp_path, "g++", [f for f in kernels.ISAS[isa][0] if f != "-mtune=native"], [])
    assert out.splitlines()[0].startswith(f"tile ISA {isa},")  # the build ran the microkernel it names
    assert_every_case_passed(out)


def test_the_native_build_runs_the_microkernel_the_kernels_report(tmp_path):
    ops = kernels.load()
    if ops is None or shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    if kernels.requested_isa() != "native":
        pytest.skip("SPECDECODE_ISA names another ISA than this CPU's own")
    out = build_and_run(tmp_path, "g++", ["-march=native"], [])
    assert out.splitlines()[0].startswith(f"tile ISA {ops.tile_isa()},")
    if X86:
        assert ops.tile_isa() != "scalar"  # every x86-64 CPU we name has at least AVX2


# float -> float16 edge cases: subnormals, ties to even (2^-25, 1.5 * 2^-24, 1 + 2^-11), the largest
# finite, the first value that rounds to infinity, negatives
HALF_CASES = ["1e-6", "-3e-8", "2.9802322387695312e-08", "8.940696716308594e-08", "1.00048828125", "65504",
              "65519", "65520", "-0.1", "3.14159", "1e-30", "-7e5"]  # fmt: skip


def assert_attention_check(out: str) -> None:
    """attention_check's float16 bits equal numpy's (round to nearest even), and its reads match."""
    import numpy as np

    lines = out.splitlines()
    for case, line in zip(HALF_CASES, lines):
        assert line == f"{case} {np.array(float(case), np.float32).astype(np.float16).view(np.uint16)}", line
    assert lines[-1].startswith("attention ") and lines[-1].endswith(" passed, 0 failed"), out


@pytest.mark.parametrize("isa", runnable_x86_isas())
def test_a_float16_kv_cache_rounds_and_reads_alike_on_each_isa(isa, tmp_path):
    flags = [f for f in kernels.ISAS[isa][0] if f != "-mtune=native"]
    assert_attention_check(
        build_and_run(tmp_path, "g++", flags, [], HERE / "native" / "attention_check.cpp", HALF_CASES)
    )


# x86 microkernels this CPU cannot run, built against test-only stand-ins for their intrinsics
# (tests/native/emulated/ISA/immintrin.h, first on the include path) and run here: AVX-512 VNNI's
# through SIMDe's portable C++ (the simde-py package's headers; -U keeps SIMDe off the host's vector
# paths while the compiler may still fuse its multiply-adds, as the hardware's are fused), AVX-VNNI's
# with only vpdpbusd replaced by an exact AVX2 loop. The same bit tests as the native builds.
EMULATED_FLAGS = {
    "avx512vnni": [
        "-march=x86-64-v3",
        *(f"-U__{m}__" for m in ("FMA", "SSE3", "SSSE3", "SSE4_1", "SSE4_2", "AVX", "AVX2", "F16C")),
        *(f"-D__{m}__" for m in ("AVX512F", "AVX512BW", "AVX512VL", "AVX512VNNI")),
        "-DSIMDE_NO_NATIVE",
        "-Wno-psabi",
    ],
    "avxvnni": ["-march=x86-64-v3", "-D__AVXVNNI__"],
}


def emulated_x86_isas() -> list[str]:
    if not X86 or shutil.which("g++") is None or not kernels.ISAS["avx2"][1] <= CPU_FLAGS:
        return []
    return [isa for isa in EMULATED_FLAGS if not kernels.ISAS[isa][1] <= CPU_FLAGS]


def emulated_flags(isa: str) -> list[str]:
    flags = [*EMULATED_FLAGS[isa], f"-I{HERE / 'native' / 'emulated' / isa}"]
    if isa == "avx512vnni":
        simde = pytest.importorskip("simde_py", reason="simde-py (the test extra) carries SIMDe's headers")
        flags.append(f"-I{simde.get_include()}")
    return flags


@pytest.mark.parametrize("isa", emulated_x86_isas())
def test_the_microkernel_of_each_isa_this_cpu_lacks_has_the_references_bits_under_emulation(isa, tmp_path):
    out = build_and_run(tmp_path, "g++", emulated_flags(isa), [])
    assert out.splitlines()[0].startswith(f"tile ISA {isa},")
    assert_every_case_passed(out)


def test_a_float16_kv_cache_rounds_and_reads_alike_on_emulated_avx512(tmp_path):
    if "avx512vnni" not in emulated_x86_isas():
        pytest.skip(
            "this CPU runs AVX-512 VNNI itself (test_a_float16_kv_cache_rounds_and_reads_alike_on_each_isa)"
        )
    source = HERE / "native" / "attention_check.cpp"
    assert_attention_check(
        build_and_run(tmp_path, "g++", emulated_flags("avx512vnni"), [], source, HALF_CASES)
    )


ARM = shutil.which("aarch64-linux-gnu-g++") and shutil.which("qemu-aarch64")


@pytest.mark.skipif(not ARM and not os.environ.get("CI"), reason="no aarch64 cross compiler or qemu-aarch64")
@pytest.mark.parametrize(
    "isa, march", [("i8mm", "armv8.2-a+dotprod+i8mm"), ("neon", "armv8.2-a+dotprod"), ("scalar", "armv8-a")]
)
def test_arm_microkernels_under_emulation_have_the_references_bits(isa, march, tmp_path):
    assert ARM, "CI installs g++-aarch64-linux-gnu and qemu-user (.ci/run)"
    out = build_and_run(tmp_path, "aarch64-linux-gnu-g++", [f"-march={march}", "-static"], ["qemu-aarch64"])
    assert out.splitlines()[0].startswith(f"tile ISA {isa},")
    assert_every_case_passed(out)


@pytest.mark.skipif(not ARM and not os.environ.get("CI"), reason="no aarch64 cross compiler or qemu-aarch64")
@pytest.mark.parametrize("march", ["armv8.2-a+dotprod", "armv8-a"])
def test_a_float16_kv_cache_rounds_and_reads_alike_on_arm(march, tmp_path):
    assert ARM, "CI installs g++-aarch64-linux-gnu and qemu-user (.ci/run)"
    source = HERE / "native" / "attention_check.cpp"
    out = build_and_run(
        tmp_path,
        "aarch64-linux-gnu-g++",
        [f"-march={march}", "-static"],
        ["qemu-aarch64"],
        source,
        HALF_CASES,
    )
    assert_attention_check(out)


def test_the_isa_switch_refuses_unknown_names_and_isas_the_cpu_lacks(monkeypatch):
    monkeypatch.setenv("SPECDECODE_ISA", "avx9000")
    with pytest.raises(UserError, match="SPECDECODE_ISA=avx9000: unknown instruction set; one of native, "):
        kernels.requested_isa()
    monkeypatch.setenv("SPECDECODE_ISA", "avx512vnni")
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags\t\t: fpu sse2 avx2 fma f16c")
    with pytest.raises(UserError, match="cannot run it .it lacks avx512_vnni, avx512bw, avx512f, avx512vl"):
        kernels.requested_isa()
    monkeypatch.setenv("SPECDECODE_ISA", " AVX2 ")
    assert kernels.requested_isa() == "avx2"
    monkeypatch.delenv("SPECDECODE_ISA")
    assert kernels.requested_isa() == "native"


def test_the_prefetch_level_is_checked_and_auto_follows_the_cpu_vendor(monkeypatch):
    """SPECDECODE_PREFETCH names a cache level or is refused; auto (the default) asks weights ahead into
    L2 on Intel's cores and into L1 on others (tile.h's ahead_into_l2, read from CPUID)."""
    ops = kernels.load()  # loaded as this process's environment asks: load() writes the level it checked
    loaded_with = os.environ.get("SPECDECODE_PREFETCH", "auto")
    for value, level in ((" L2 ", "l2"), ("l1", "l1"), ("", "auto"), ("l3", None)):
        monkeypatch.setenv("SPECDECODE_PREFETCH", value)
        if level is None:
            with pytest.raises(
                UserError, match="SPECDECODE_PREFETCH=l3: unknown cache level; one of auto, l1, l2"
            ):
                kernels.requested_prefetch()
        else:
            assert kernels.requested_prefetch() == level
    if ops is None or not X86 or kernels.requested_isa() == "scalar":
        pytest.skip("no x86 microkernel built here")
    if loaded_with != "auto":
        pytest.skip(f"the kernels were loaded with SPECDECODE_PREFETCH={loaded_with}")
    intel = "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    assert ops.tile_prefetch() == ("l2" if intel else "l1")

// The most integer multiply-adds a core issues with the instructions the tile microkernels use, per
// cycle, from registers (no memory): the ceiling a kernel's multiply-adds a cycle (tile_stream.cpp,
// anatomy.py) are read against (docs/native_forward.md). The core clock under load is measured, not
// taken from the CPU's name, by a chain of dependent vpaddd (1 cycle of latency on every x86 core the
// tiles target). 12 independent accumulators in registers (vpdpbusd's latency is at most 5).
//   g++ -O2 -march=native scripts/isa_peak.cpp -o /tmp/peak && /tmp/peak
//   g++ -O2 -mavx2 -mfma [-mavxvnni] scripts/isa_peak.cpp -o /tmp/peak   (another ISA's instructions)
#include <chrono>
#include <cstdio>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
#define REP12(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
#define LOOP(BODY)                                                   \
  [](long n) {                                                       \
    const double t = now();                                          \
    for (long i = 0; i < n; ++i) asm volatile(BODY ::: "memory");    \
    return now() - t;                                                \
  }
#define CHAIN(i) "vpaddd %%xmm14, %%xmm15, %%xmm15\n\t"
#define MADDUBS(i) "vpmaddubsw %%ymm13, %%ymm12, %%ymm" #i "\n\t"
// the AVX2 tiles' inner step: a product of bytes into int16 pairs, added to an int16 sum
#define MADDUBS_ADD(i) "vpmaddubsw %%ymm13, %%ymm12, %%ymm14\n\tvpaddw %%ymm14, %%ymm" #i ", %%ymm" #i "\n\t"
#define DPBUSD_Y(i) "%{vex%} vpdpbusd %%ymm13, %%ymm12, %%ymm" #i "\n\t"
#define DPBUSD_Z(i) "vpdpbusd %%zmm13, %%zmm12, %%zmm" #i "\n\t"

int main() {
  const long n = 40000000;
  const double ghz = 12.0 * n / LOOP(REP12(CHAIN))(n) / 1e9;
  std::printf("core clock under load %.2f GHz (a chain of dependent vpaddd)\n", ghz);
  auto report = [&](const char* what, double secs, int macs) {
    const double per = 12.0 * n / secs / 1e9 / ghz;
    std::printf("%-28s %.2f a cycle = %5.1f multiply-adds a cycle a core\n", what, per, per * macs);
  };
  report("vpmaddubsw ymm", LOOP(REP12(MADDUBS))(n), 32);
  report("vpmaddubsw ymm + vpaddw", LOOP(REP12(MADDUBS_ADD))(n), 32);
#if defined(__AVXVNNI__)
  report("vpdpbusd ymm", LOOP(REP12(DPBUSD_Y))(n), 32);
#endif
#if defined(__AVX512VNNI__)
  report("vpdpbusd zmm", LOOP(REP12(DPBUSD_Z))(n), 64);
#endif
}

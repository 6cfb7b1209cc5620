// The interleaved tile layout of `--dtype gguf` (described in kernels_tile.cpp) and what every ISA's
// microkernel shares: one row's activation quantizer, the scale formats, and the loop over a range of
// 16-row weight groups. kernels_tile.cpp's per-matrix calls and stack.cpp's whole forward both come
// here, so both give a row the same bits.
//
// One layout, a microkernel per ISA (chosen when the kernels are built, kernels.py's SPECDECODE_ISA):
//   tile_avx512.h  AVX-512 VNNI (Zen 4/5, Xeon): one vpdpbusd serves 16 weight rows
//   tile_avx2.h    AVX2 (Zen 1-3, Intel client chips) with maddubs, or AVX-VNNI's 256-bit vpdpbusd
//   tile_neon.h    ARM with dot products (vdotq_s32), and int8 matrix multiplies (vmmlaq_s32) with i8mm
//   tile_ref.h     portable C++: the reference every microkernel is tested against bit for bit, and
//                  the kernel where none of the above is built
// Every microkernel forms each output lane with the same float operations in the same order (an
// exact integer dot product per block, converted, then fused multiply-adds), so a row's result is the
// same bits on every ISA, alone or in a batch of any size.
//
// This header needs no torch: tests/native/tile_check.cpp builds it alone, for this CPU and for ARM
// under emulation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "half.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SPECDECODE_TILE_AVX512 1
#define SPECDECODE_TILE_ISA "avx512vnni"
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECDECODE_TILE_AVX2 1
#include <immintrin.h>
#if defined(__AVXVNNI__)
#define SPECDECODE_TILE_ISA "avxvnni"
#else
#define SPECDECODE_TILE_ISA "avx2"
#endif
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define SPECDECODE_TILE_NEON 1
#if defined(__ARM_FEATURE_MATMUL_INT8)
#define SPECDECODE_TILE_ISA "i8mm"
#else
#define SPECDECODE_TILE_ISA "neon"
#endif
#else
#define SPECDECODE_TILE_ISA "scalar"
#endif

namespace tile {

constexpr int64_t R = 16;           // weight rows per group (one int32 lane each on AVX-512)
constexpr int64_t PREFETCH = 4096;  // bytes ahead of the block being read (measured on Zen 5: 1-16 KiB)

#if defined(SPECDECODE_TILE_AVX512) || defined(SPECDECODE_TILE_AVX2)
// Which cache the x86 microkernels ask the weights' lines ahead into, chosen once a process: L2
// (_MM_HINT_T1) on Intel's cores, L1 elsewhere; SPECDECODE_PREFETCH=l1|l2 overrides (kernels.py checks
// the value). Asked into L1, each line ahead holds one of the core's few L1 fill buffers until it
// arrives; into L2, it waits in L2's larger queue instead (the likely reason Intel gains). On a
// Xeon (family 6 model 167, 2 threads, scripts/tile_stream.cpp over 1.2 GB of Q4_K and 0.8 GB of
// Q6_K, past its L3; three interleaved rounds, medians) L2 took AVX2's 1 / 4 / 8 rows of Q4_K
// 66.4 / 81.5 / 130.1 -> 60.6 / 75.7 / 131.4 ms and of Q6_K 63.5 / 85.1 / 152.5 -> 55.7 / 82.7 / 131.7,
// AVX-512's Q4_K 68.2 / 76.3 / 86.7 -> 62.6 / 71.4 / 85.8 and Q6_K 65.7 / 71.0 / 80.3 -> 61.2 / 68.8 /
// 77.2; on a Zen 5 it made AVX2's 4 / 8 rows slower (13.1 / 30.8 -> 15.5 / 34.8 ms, 300 MB) and
// AVX-512 level (docs/native_forward.md).
inline const bool ahead_into_l2 = [] {
  const char* env = std::getenv("SPECDECODE_PREFETCH");
  if (env != nullptr && *env != 0 && std::strcmp(env, "auto") != 0) return std::strcmp(env, "l2") == 0;
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));  // the vendor: "GenuineIntel"
  return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;
}();
// the line at p, asked for ahead of its use: into ahead_into_l2's cache where `l2_helps` (the caller's
// rows of x), else into L1
[[gnu::always_inline]] inline void prefetch(const uint8_t* p, bool l2_helps = true) {
  if (ahead_into_l2 && l2_helps)
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  else
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}
#endif

// rows of x per pass over a group's blocks. On AVX2 (16 registers) 8 accumulators and a block's 8
// unpacked registers spill some to L1, yet 8 rows a pass beat 4 (a 1.5B-sized stack of Q4_K/Q6_K
// matrices from DRAM on Zen 3, 2 threads: 8 rows 34-38 ms against 38-44, 5 rows 24-27 against 28-30).
// AVX-512 has 32 registers: 16 accumulators beside the 8 unpacked ones, so k 8's 9 rows take one pass
// (a second pass works from cache while the weight stream idles: the 1.5B on Zen 5, 2 threads,
// r(9) was 1.55 against r(8) 1.23 with passes of 8, 1.33 with 16: docs/native_forward.md)
// AVX2 / AVX-VNNI take up to 12 in one sweep, a block worked for sets of at most 4 rows whose sums
// stay in registers (tile_avx2.h's group_both): k 8's 9 rows then read each group once there too.
#if defined(SPECDECODE_TILE_AVX512)
constexpr int64_t MAX_X = 16;
#elif defined(SPECDECODE_TILE_AVX2)
constexpr int64_t MAX_X = 12;
#else
constexpr int64_t MAX_X = 8;
#endif

// A float16 as the file stores it (torch's at::Half has this layout)
struct f16 {
  uint16_t bits;
};

inline float to_float(f16 h) { return half::to_float(h.bits); }  // exactly
inline float to_float(float x) { return x; }

// x [M, K] float32 -> q [M, K] int8, d [M, G] (scale), S [M, G] (d * sum q), h [M, G, 2] (sums of
// q over weights 0..15 and 16..31, times 128: the q8 bias to subtract): q = nearbyint(x * 127 /
// max|x|), d = max|x| / 127, per block of 32, each row on its own.
inline void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* S, int32_t* h) {
  const int64_t G = K / 32;
  for (int64_t i = 0; i < M * G; ++i) {
    const float* b = x + i * 32;
#if defined(SPECDECODE_TILE_AVX512)
    // the same bytes, 16 at a time: |x| max, x * (127 / max) rounded to nearest even (as nearbyint)
    const __m512 lo_x = _mm512_loadu_ps(b), hi_x = _mm512_loadu_ps(b + 16);
    const float vmax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo_x), _mm512_abs_ps(hi_x)));
    const __m512 vinv = _mm512_set1_ps(vmax > 0.f ? 127.f / vmax : 0.f);
    const __m512i ql = _mm512_cvtps_epi32(_mm512_mul_ps(lo_x, vinv)), qh = _mm512_cvtps_epi32(_mm512_mul_ps(hi_x, vinv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 32), _mm512_cvtepi32_epi8(ql));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 32 + 16), _mm512_cvtepi32_epi8(qh));
    const int vlo = _mm512_reduce_add_epi32(ql), vhi = _mm512_reduce_add_epi32(qh);
    d[i] = vmax / 127.f;
    S[i] = d[i] * static_cast<float>(vlo + vhi);
    h[2 * i] = 128 * vlo, h[2 * i + 1] = 128 * vhi;
    continue;
#endif
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(b[j]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int lo = 0, hi = 0;
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(b[j] * inv));
      q[i * 32 + j] = static_cast<int8_t>(v);
      (j < 16 ? lo : hi) += v;
    }
    d[i] = amax / 127.f;
    S[i] = d[i] * static_cast<float>(lo + hi);
    h[2 * i] = 128 * lo, h[2 * i + 1] = 128 * hi;
  }
}

// Factored scales (Scale = uint8_t; K-quants, gguf_weights.Interleaved): per group and super-block of
// 8 blocks, FACTORED bytes: 2 x 16 float16 factors (q4: d, -dmin; q8: d, d), then per block 2 x 16
// int8 multipliers (q4: sc, m; q8: the two halves' sc). A block's scale is factor x multiplier, formed
// in float32 exactly as the file's dequantization forms it (11 x 7 significant bits: no rounding).
constexpr int64_t FACTORED = 2 * R * 2 + 8 * 2 * R;

// scale elements of one group of 16 rows over G blocks
template <typename Scale, bool ONE = false>
constexpr int64_t scale_stride(int64_t G) {
  if constexpr (std::is_same_v<Scale, uint8_t>)
    return G / 8 * FACTORED;
  else
    return G * (ONE ? 16 : 32);
}

// lane l's two scales of block g (s1: q4's offset, or q8's second half; ONE: s1 = s0)
template <bool ONE, typename Scale>
inline void lane_scales(const Scale* ws, int64_t g, int l, float& s0, float& s1) {
  if constexpr (std::is_same_v<Scale, uint8_t>) {
    const uint8_t* sb = ws + (g >> 3) * FACTORED;
    const auto* f = reinterpret_cast<const f16*>(sb);
    const auto* c = reinterpret_cast<const int8_t*>(sb + 4 * R + (g & 7) * 2 * R);
    s0 = to_float(f[l]) * static_cast<float>(c[l]);
    s1 = to_float(f[R + l]) * static_cast<float>(c[R + l]);
  } else {
    constexpr int64_t per = ONE ? 16 : 32;
    s0 = to_float(ws[g * per + l]), s1 = ONE ? s0 : to_float(ws[g * per + 16 + l]);
  }
}

// Activation rows quantized for the tiles (quantize's outputs) of M rows of K inputs.
struct QuantRows {
  const int8_t* q;
  const float* d;
  const float* S;
  const int32_t* h;
};

}  // namespace tile

#include "tile_ref.h"
#if defined(SPECDECODE_TILE_AVX512)
#include "tile_avx512.h"
#elif defined(SPECDECODE_TILE_AVX2)
#include "tile_avx2.h"
#elif defined(SPECDECODE_TILE_NEON)
#include "tile_neon.h"
#endif

namespace tile {

// Outputs of one group of 16 weight rows for MB rows of x from m0: this build's microkernel. Pass
// `pass` of `passes` over the group; next: the next group's weights (prefetched while this one is
// worked from cache), or null.
template <int BITS, int MB, typename Scale, bool ONE = false>
inline void group_tile(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                       const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0,
                       [[maybe_unused]] const uint8_t* next, [[maybe_unused]] int pass,
                       [[maybe_unused]] int passes) {
#if defined(SPECDECODE_TILE_AVX512)
  avx512::group_tile<BITS, MB, Scale, ONE>(wq, ws, xq, xd, xS, xh, y, G, N, r0, valid, m0);
#elif defined(SPECDECODE_TILE_AVX2)
  avx2::group_tile<BITS, MB, Scale, ONE>(wq, ws, xq, xd, xS, xh, y, G, N, r0, valid, m0, next, pass, passes);
#elif defined(SPECDECODE_TILE_NEON)
  neon::group_tile<BITS, MB, Scale, ONE>(wq, ws, xq, xd, xS, xh, y, G, N, r0, valid, m0, next, pass, passes);
#else
  ref::group_tile<BITS, Scale, ONE>(wq, ws, xq, xd, xS, xh, y, G, N, r0, valid, m0, MB);
#endif
}

// y[:, r] for the weight rows of groups g0..g1 of an interleaved matrix of N rows and K = 32 G inputs
// (wq [groups, G, 64 BITS], ws [groups, G, 2 or (ONE) 1, 16], or factored [groups, G / 8, FACTORED])
// and all M rows of x; y's rows are ldy apart.
// The most rows of x one pass over a group takes, for a call of M rows: MAX_X, but on AVX2 by the call's
// rows and the matrix kind (tile_avx2.h's rows_a_pass)
template <int BITS, bool ONE>
inline int64_t rows_a_pass([[maybe_unused]] int64_t M) {
#if defined(SPECDECODE_TILE_AVX2)
  return avx2::rows_a_pass<BITS, ONE>(M);
#else
  return MAX_X;
#endif
}

template <int BITS, typename Scale, bool ONE = false>
void groups(const uint8_t* wq, const Scale* ws, const QuantRows& x, float* y, int64_t ldy, int64_t M, int64_t G,
            int64_t N, int64_t g0, int64_t g1) {
  for (int64_t grp = g0; grp < g1; ++grp) {
    const uint8_t* gw = wq + grp * G * BITS * 64;
    const Scale* gs = ws + grp * scale_stride<Scale, ONE>(G);
    const int64_t valid = std::min(R, N - grp * R);
    const uint8_t* next = grp + 1 < g1 ? gw + G * BITS * 64 : nullptr;
    const int64_t most = rows_a_pass<BITS, ONE>(M);
    const int passes = static_cast<int>((M + most - 1) / most);
    for (int64_t m0 = 0, pass = 0; m0 < M; ++pass) {  // passes of at most `most` rows, as even as they divide
      const int64_t left = M - m0, more = passes - pass, mb = (left + more - 1) / more;
      switch (mb) {  // the counts up to MAX_X, the most a pass takes on this ISA
#define SPECDECODE_TILE(n)                                                                                       \
  case n:                                                                                                        \
    if constexpr (n <= MAX_X)                                                                                    \
      group_tile<BITS, n, Scale, ONE>(gw, gs, x.q, x.d, x.S, x.h, y, G, ldy, grp * R, valid, m0, next, pass, passes); \
    break;
        SPECDECODE_TILE(1) SPECDECODE_TILE(2) SPECDECODE_TILE(3) SPECDECODE_TILE(4)
        SPECDECODE_TILE(5) SPECDECODE_TILE(6) SPECDECODE_TILE(7) SPECDECODE_TILE(8)
        SPECDECODE_TILE(9) SPECDECODE_TILE(10) SPECDECODE_TILE(11) SPECDECODE_TILE(12)
        SPECDECODE_TILE(13) SPECDECODE_TILE(14) SPECDECODE_TILE(15) SPECDECODE_TILE(16)
#undef SPECDECODE_TILE
      }
      m0 += mb;
    }
  }
}

}  // namespace tile

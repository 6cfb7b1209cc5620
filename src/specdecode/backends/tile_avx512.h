// tile.h's microkernel for AVX-512 VNNI (Zen 4/5, Xeon): a block of 32 weights of 16 rows is 4
// registers of nibbles (q4) unpacked once into 8, and each row of x then costs 8 vpdpbusd with its 4
// activation bytes broadcast, one conversion and two FMAs for 16 outputs, no horizontal sums (ggml's
// repacked Q4_0x8 and ik_llama.cpp's unpackers are the idea; the layout and code are ours).
#pragma once

#include <immintrin.h>

namespace tile::avx512 {

inline __m512 scales16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 scales16(const f16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// block g's two scale vectors (16 rows each) of a group's scales
template <bool ONE, typename Scale>
inline void block_scales(const Scale* ws, int64_t g, __m512& s0, __m512& s1) {
  if constexpr (std::is_same_v<Scale, uint8_t>) {
    const uint8_t* sb = ws + (g >> 3) * FACTORED;
    const auto* c = reinterpret_cast<const __m128i*>(sb + 4 * R + (g & 7) * 2 * R);
    s0 = _mm512_mul_ps(scales16(reinterpret_cast<const f16*>(sb)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c))));
    s1 = _mm512_mul_ps(scales16(reinterpret_cast<const f16*>(sb) + R),
                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c + 1))));
  } else {
    constexpr int64_t per = ONE ? 16 : 32;  // scales a block
    s0 = scales16(ws + g * per), s1 = ONE ? s0 : scales16(ws + g * per + 16);
  }
}

// Outputs of one group of 16 weight rows for MB rows of x from m0 (y row stride N, `valid` of the
// 16 rows real). Q4: <w, x> = sum_g s d (q_w . q_x) + o S; Q8: sum_g d (s_lo (.)_lo + s_hi (.)_hi);
// Q8 with ONE scale a block (Q8_0's d, scales [groups, G, 1, 16]): sum_g d s (q_w . q_x), one
// conversion, multiply and FMA a block and row of x instead of two each, and half the scale bytes.
// BITS: 4 (q4), 8 (q8), 6 (q6: a q8 matrix whose weights all lie in -32..31, stored as q + 32 in
// q4's nibble registers and two registers of high bits, register t's at bits 2 (t % 4) of register
// t / 4; unpacked to q8's unsigned bytes, whose bias of 32 sum(x) is subtracted in integers) or 5
// (q5: weights in -16..15, q + 16, one register of high bits, register t's at bit t; bias 16 sum(x)).
template <int BITS, int MB, typename Scale, bool ONE = false>
void group_tile(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0) {
  constexpr bool Q4 = BITS == 4;
  constexpr int64_t bytes = BITS * 64;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(15);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* p = wq + g * bytes;
    // the block PREFETCH bytes ahead, asked for now: with several rows of x a block's work hides
    // the wait only if its lines are already on the way (the hardware prefetcher alone leaves the
    // stream idle while the core computes: T(8) was T(1) plus the compute, not the larger of them)
    // (into L2 on Intel's cores only for 1-2 rows of x: the 1.5B on a Xeon, two alternating rounds,
    // T(1) / T(2) 51.3 / 53.7 -> 48.2 / 51.5 ms, T(4) level, T(8) / T(9) 66.8 / 69.3 -> 70.4 / 71.8)
    for (int i = 0; i < BITS; ++i) prefetch(p + PREFETCH + 64 * i, MB <= 2);
    __m512i u[8];
    if constexpr (Q4) {
      for (int t = 0; t < 4; ++t) {
        const __m512i b = _mm512_loadu_si512(p + 64 * t);
        u[t] = _mm512_and_si512(b, low);
        u[t + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
      }
    } else if constexpr (BITS == 5 || BITS == 6) {  // q4's nibbles, each with its high bits put back above it
      constexpr int H = BITS - 4, PER = 8 / H;  // high bits a register; registers a byte of high bits
      const __m512i hbits = _mm512_set1_epi8(static_cast<char>(((1 << H) - 1) << 4));
      for (int t = 0; t < 8; ++t) {
        const __m512i hb = _mm512_loadu_si512(p + 256 + 64 * (t / PER));
        const int at = H * (t % PER);  // its bits at `at` of hb's byte -> bits 4..4 + H - 1
        const __m512i moved = at < 4 ? _mm512_slli_epi16(hb, 4 - at) : at == 4 ? hb : _mm512_srli_epi16(hb, at - 4);
        u[t] = _mm512_and_si512(moved, hbits);
      }
      for (int t = 0; t < 4; ++t) {
        const __m512i b = _mm512_loadu_si512(p + 64 * t);  // (A & low) | B: ternary-logic table 0xEC
        u[t] = _mm512_ternarylogic_epi32(b, u[t], low, 0xEC);
        u[t + 4] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(b, 4), u[t + 4], low, 0xEC);
      }
    } else {
      for (int t = 0; t < 8; ++t) u[t] = _mm512_loadu_si512(p + 64 * t);
    }
    constexpr int bias = Q4 ? 0 : 8 - BITS;  // q6 bytes are q + 32, q5's q + 16 (q8: q + 128): 128 sum(x) >> 2, 3
    __m512 s0, s1;
    block_scales<ONE>(ws, g, s0, s1);
#pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) {
      const int64_t xi = (m0 + m) * G + g;
      const int32_t* xb = reinterpret_cast<const int32_t*>(xq + xi * 32);
      const __m512 d = _mm512_set1_ps(xd[xi]);
      if constexpr (Q4) {
        __m512i dot = _mm512_setzero_si512();
        for (int t = 0; t < 8; ++t) dot = _mm512_dpbusd_epi32(dot, u[t], _mm512_set1_epi32(xb[t]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s0, d), acc[m]);
        acc[m] = _mm512_fmadd_ps(s1, _mm512_set1_ps(xS[xi]), acc[m]);
      } else if constexpr (ONE) {
        __m512i dot = _mm512_set1_epi32(-((xh[2 * xi] + xh[2 * xi + 1]) >> bias));
        for (int t = 0; t < 8; ++t) dot = _mm512_dpbusd_epi32(dot, u[t], _mm512_set1_epi32(xb[t]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s0, d), acc[m]);
      } else {
        __m512i lo = _mm512_set1_epi32(-(xh[2 * xi] >> bias)), hi = _mm512_set1_epi32(-(xh[2 * xi + 1] >> bias));
        for (int t = 0; t < 4; ++t) lo = _mm512_dpbusd_epi32(lo, u[t], _mm512_set1_epi32(xb[t]));
        for (int t = 4; t < 8; ++t) hi = _mm512_dpbusd_epi32(hi, u[t], _mm512_set1_epi32(xb[t]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(s0, d), acc[m]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(s1, d), acc[m]);
      }
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << valid) - 1);
  for (int m = 0; m < MB; ++m) _mm512_mask_storeu_ps(y + (m0 + m) * N + r0, keep, acc[m]);
}

}  // namespace tile::avx512

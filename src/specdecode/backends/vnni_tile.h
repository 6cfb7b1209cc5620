// The interleaved VNNI tiles (kernels_vnni.cpp's layout, described there): one row's activation
// quantizer and the tile loop over a range of 16-row weight groups, shared by kernels_vnni.cpp's
// per-matrix calls and stack.cpp's whole forward, so both give a row the same bits.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPECDECODE_VNNI 1
#include <immintrin.h>
#endif

namespace vnni {

constexpr int64_t R = 16;      // weight rows per group (one int32 lane each)
constexpr int64_t MAX_X = 8;   // rows of x per pass over a group's blocks
constexpr int64_t PREFETCH = 4096;  // bytes ahead of the block being read (measured on Zen 5: 1-16 KiB)

// x [M, K] float32 -> q [M, K] int8, d [M, G] (scale), S [M, G] (d * sum q), h [M, G, 2] (sums of
// q over weights 0..15 and 16..31, times 128: the q8 bias to subtract). The bytes are those of
// kernels_i8.cpp's quantize_rows: q = nearbyint(x * 127 / max|x|), d = max|x| / 127.
inline void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* S, int32_t* h) {
  const int64_t G = K / 32;
  for (int64_t i = 0; i < M * G; ++i) {
    const float* b = x + i * 32;
#if SPECDECODE_VNNI
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

#if SPECDECODE_VNNI
inline __m512 scales16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 scales16(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#endif

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

#if SPECDECODE_VNNI
// block g's two scale vectors (16 rows each) of a group's scales
template <bool ONE, typename Scale>
inline void block_scales(const Scale* ws, int64_t g, __m512& s0, __m512& s1) {
  if constexpr (std::is_same_v<Scale, uint8_t>) {
    const uint8_t* sb = ws + (g >> 3) * FACTORED;
    const auto* c = reinterpret_cast<const __m128i*>(sb + 4 * R + (g & 7) * 2 * R);
    s0 = _mm512_mul_ps(scales16(reinterpret_cast<const at::Half*>(sb)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c))));
    s1 = _mm512_mul_ps(scales16(reinterpret_cast<const at::Half*>(sb) + R),
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
    for (int i = 0; i < BITS; ++i) _mm_prefetch(reinterpret_cast<const char*>(p + PREFETCH + 64 * i), _MM_HINT_T0);
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
#pragma GCC unroll 8
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
#endif

// Activation rows quantized for the tiles (quantize's outputs) of M rows of K inputs.
struct QuantRows {
  const int8_t* q;
  const float* d;
  const float* S;
  const int32_t* h;
};

#if SPECDECODE_VNNI
// y[:, r] for the weight rows of groups g0..g1 of an interleaved matrix of N rows and K = 32 G inputs
// (wq [groups, G, 64 BITS], ws [groups, G, 2 or (ONE) 1, 16], or factored [groups, G / 8, FACTORED])
// and all M rows of x; y's rows are
// ldy apart.
template <int BITS, typename Scale, bool ONE = false>
void groups(const uint8_t* wq, const Scale* ws, const QuantRows& x, float* y, int64_t ldy, int64_t M, int64_t G,
            int64_t N, int64_t g0, int64_t g1) {
  for (int64_t grp = g0; grp < g1; ++grp) {
    const uint8_t* gw = wq + grp * G * BITS * 64;
    const Scale* gs = ws + grp * scale_stride<Scale, ONE>(G);
    const int64_t valid = std::min(R, N - grp * R);
    for (int64_t m0 = 0; m0 < M;) {  // passes of at most MAX_X rows, as even as they divide
      const int64_t left = M - m0, passes = (left + MAX_X - 1) / MAX_X, mb = (left + passes - 1) / passes;
      switch (mb) {
#define SPECDECODE_TILE(n) \
  case n: group_tile<BITS, n, Scale, ONE>(gw, gs, x.q, x.d, x.S, x.h, y, G, ldy, grp * R, valid, m0); break;
        SPECDECODE_TILE(1) SPECDECODE_TILE(2) SPECDECODE_TILE(3) SPECDECODE_TILE(4)
        SPECDECODE_TILE(5) SPECDECODE_TILE(6) SPECDECODE_TILE(7) SPECDECODE_TILE(8)
#undef SPECDECODE_TILE
      }
      m0 += mb;
    }
  }
}
#endif

}  // namespace vnni

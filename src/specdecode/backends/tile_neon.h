// tile.h's microkernel for ARM with dot products (Apple M1 on, Graviton 2 on, Ampere Altra: armv8.2-a
// +dotprod). A group's 16 rows are worked as four quarters of 4, each quarter of a register t's 64
// bytes one 128-bit register: a block of 32 weights of 4 rows is unpacked once into 8 registers, then
// each row of x costs 8 vdotq_s32 (signed bytes) with its 4 activation bytes duplicated, one
// conversion and one or two FMAs for 4 outputs. q4, q5 and q6 bytes (0..63) are valid signed bytes as
// they are; q8's q + 128 goes back to q, whose dot product needs no bias. The integer sums are exact,
// so the floats that follow are those of tile_ref.h.
//
// With the int8 matrix multiply (armv8.6-a i8mm: Graviton 3 on, Apple M2 on; SPECDECODE_ISA=i8mm), rows
// of x go in pairs: register pairs (t, t + 1) are zipped once a block into 2 rows x 8 bytes, and one
// vmmlaq_s32 forms 2 weight rows x 2 rows of x, so a pair of x rows costs 8 of them where dot products
// cost 16. The same exact integer sums go into the same float operations.
#pragma once

#include <arm_neon.h>

namespace tile::neon {

inline float32x4_t scales4(const float* p) { return vld1q_f32(p); }
inline float32x4_t scales4(const f16* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(&p->bits))); }
inline float32x4_t int8s(const uint8_t* p) {  // 4 int8 -> 4 floats
  int32_t word;
  std::memcpy(&word, p, 4);
  const int16x8_t wide = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(word)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(wide)));
}

// block g's two scale vectors for rows 4 q..4 q + 3 of a group's scales
template <bool ONE, typename Scale>
inline void block_scales(const Scale* ws, int64_t g, int q, float32x4_t& s0, float32x4_t& s1) {
  if constexpr (std::is_same_v<Scale, uint8_t>) {
    const uint8_t* sb = ws + (g >> 3) * FACTORED;
    const auto* f = reinterpret_cast<const f16*>(sb);
    const uint8_t* c = sb + 4 * R + (g & 7) * 2 * R;
    s0 = vmulq_f32(scales4(f + 4 * q), int8s(c + 4 * q));
    s1 = vmulq_f32(scales4(f + R + 4 * q), int8s(c + R + 4 * q));
  } else {
    constexpr int64_t per = ONE ? 16 : 32;
    s0 = scales4(ws + g * per + 4 * q), s1 = ONE ? s0 : scales4(ws + g * per + 16 + 4 * q);
  }
}

// init + the dot products of registers T0..T1-1 with x's 4 bytes each
template <int T0, int T1>
inline int32x4_t dots(const int8x16_t* u, const int32_t* xb, int32x4_t init) {
  for (int t = T0; t < T1; ++t) init = vdotq_s32(init, u[t], vreinterpretq_s8_s32(vdupq_n_s32(xb[t])));
  return init;
}

// Outputs of one group of 16 weight rows for MB rows of x from m0 (tile_ref.h's group_tile).
// A group is swept 4 x passes times; each sweep prefetches its share of the next group's lines, as
// tile_avx2.h's do.
template <int BITS, int MB, typename Scale, bool ONE = false>
void group_tile(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0,
                const uint8_t* next, int pass, int passes) {
  constexpr bool Q4 = BITS == 4, SIGNED = BITS == 8;
  constexpr int64_t bytes = BITS * 64;
  constexpr int bias = Q4 ? 0 : 8 - BITS;
  const uint8x16_t low = vdupq_n_u8(15);
  const int sweeps = 4 * passes;
  for (int q = 0; q < 4 && 4 * q < valid; ++q) {
    const int sweep = 4 * pass + q;
    float32x4_t acc[MB];
    for (int m = 0; m < MB; ++m) acc[m] = vdupq_n_f32(0.f);
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* p = wq + g * bytes + 16 * q;
      if (q == 0 && pass == 0)
        for (int i = 0; i < BITS; ++i) __builtin_prefetch(p + PREFETCH + 64 * i);
      if (next != nullptr)
        for (int i = sweep; i < BITS; i += sweeps) __builtin_prefetch(next + g * bytes + 64 * i);
      int8x16_t u[8];
      if constexpr (BITS == 8) {
        for (int t = 0; t < 8; ++t) u[t] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p + 64 * t), vdupq_n_u8(0x80)));
      } else {
        uint8x16_t w[8];
        for (int t = 0; t < 4; ++t) {
          const uint8x16_t b = vld1q_u8(p + 64 * t);
          w[t] = vandq_u8(b, low);
          w[t + 4] = vshrq_n_u8(b, 4);
        }
        if constexpr (BITS == 5 || BITS == 6) {
          constexpr int H = BITS - 4, PER = 8 / H;
          const uint8x16_t mask = vdupq_n_u8((1 << H) - 1);
          for (int t = 0; t < 8; ++t) {
            const uint8x16_t hb = vld1q_u8(p + 256 + 64 * (t / PER));
            const uint8x16_t high = vandq_u8(vshlq_u8(hb, vdupq_n_s8(static_cast<int8_t>(-H * (t % PER)))), mask);
            w[t] = vorrq_u8(w[t], vshlq_n_u8(high, 4));
          }
        }
        for (int t = 0; t < 8; ++t) u[t] = vreinterpretq_s8_u8(w[t]);
      }
      float32x4_t s0, s1;
      block_scales<ONE>(ws, g, q, s0, s1);
      // the bias a half (0, 1) or the whole block (2) of x row m's dot product starts from
      const auto start = [&](int m, int half) -> int32_t {
        const int64_t xi = (m0 + m) * G + g;
        if constexpr (SIGNED || Q4) return 0;
        return half == 2 ? -((xh[2 * xi] + xh[2 * xi + 1]) >> bias) : -(xh[2 * xi + half] >> bias);
      };
      // x row m's float work on its integer dot products (lo: the whole block for q4 and one scale)
      const auto finish = [&](int m, int32x4_t lo, int32x4_t hi) {
        const int64_t xi = (m0 + m) * G + g;
        const float32x4_t d = vdupq_n_f32(xd[xi]);
        acc[m] = vfmaq_f32(acc[m], vcvtq_f32_s32(lo), vmulq_f32(s0, d));
        if constexpr (Q4) {
          acc[m] = vfmaq_f32(acc[m], s1, vdupq_n_f32(xS[xi]));
        } else if constexpr (!ONE) {
          acc[m] = vfmaq_f32(acc[m], vcvtq_f32_s32(hi), vmulq_f32(s1, d));
        }
      };
      int m = 0;
#if defined(__ARM_FEATURE_MATMUL_INT8)
      int8x16_t w01[4], w23[4];  // zipped pairs (2p, 2p + 1): rows 0-1 and 2-3 of the quarter, 8 bytes each
      for (int pr = 0; pr < 4; ++pr) {
        const int32x4_t a = vreinterpretq_s32_s8(u[2 * pr]), b = vreinterpretq_s32_s8(u[2 * pr + 1]);
        w01[pr] = vreinterpretq_s8_s32(vzip1q_s32(a, b));
        w23[pr] = vreinterpretq_s8_s32(vzip2q_s32(a, b));
      }
      for (; m + 1 < MB; m += 2) {
        const int8_t* xa = xq + ((m0 + m) * G + g) * 32;
        const int8_t* xb = xa + G * 32;  // row m + 1's same block
        const auto pairs = [&](int p0, int p1, int32_t ba, int32_t bb, int32x4_t& ra, int32x4_t& rb) {
          const int32x4_t init = {ba, bb, ba, bb};  // the 2 x 2 products: [w0 xa, w0 xb, w1 xa, w1 xb]
          int32x4_t a01 = init, a23 = init;
          for (int pr = p0; pr < p1; ++pr) {
            const int8x16_t x2 = vcombine_s8(vld1_s8(xa + 8 * pr), vld1_s8(xb + 8 * pr));
            a01 = vmmlaq_s32(a01, w01[pr], x2);
            a23 = vmmlaq_s32(a23, w23[pr], x2);
          }
          ra = vuzp1q_s32(a01, a23), rb = vuzp2q_s32(a01, a23);
        };
        int32x4_t lo_a, lo_b, hi_a = vdupq_n_s32(0), hi_b = vdupq_n_s32(0);
        if constexpr (Q4 || ONE) {
          pairs(0, 4, start(m, 2), start(m + 1, 2), lo_a, lo_b);
        } else {
          pairs(0, 2, start(m, 0), start(m + 1, 0), lo_a, lo_b);
          pairs(2, 4, start(m, 1), start(m + 1, 1), hi_a, hi_b);
        }
        finish(m, lo_a, hi_a);
        finish(m + 1, lo_b, hi_b);
      }
#endif
      for (; m < MB; ++m) {
        const auto* xb = reinterpret_cast<const int32_t*>(xq + ((m0 + m) * G + g) * 32);
        if constexpr (Q4 || ONE) {
          finish(m, dots<0, 8>(u, xb, vdupq_n_s32(start(m, 2))), vdupq_n_s32(0));
        } else {
          finish(m, dots<0, 4>(u, xb, vdupq_n_s32(start(m, 0))), dots<4, 8>(u, xb, vdupq_n_s32(start(m, 1))));
        }
      }
    }
    const int64_t rows = std::min<int64_t>(4, valid - 4 * q);
    for (int m = 0; m < MB; ++m) {
      float* out = y + (m0 + m) * N + r0 + 4 * q;
      if (rows == 4) {
        vst1q_f32(out, acc[m]);
      } else {
        float t[4];
        vst1q_f32(t, acc[m]);
        for (int64_t l = 0; l < rows; ++l) out[l] = t[l];
      }
    }
  }
}

}  // namespace tile::neon

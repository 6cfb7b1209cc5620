// The reference microkernel of tile.h's layout, in portable C++: one weight lane at a time, each
// block's integer dot product formed exactly, then the float operations every ISA's microkernel uses,
// in the same order. It is the oracle of the bit tests (tests/native/tile_check.cpp) and the kernel
// of a build for a CPU without one of its own.
#pragma once

#include <cmath>
#include <cstdint>

namespace tile::ref {

// byte b of register t of lane l in a block's BITS * 64 bytes, as the microkernels unpack it: q4's
// nibbles (0..15), q5/q6's nibbles with their high bits put back (q + 16, q + 32), q8's bytes (q + 128)
template <int BITS>
inline int weight(const uint8_t* p, int t, int l, int b) {
  const int at = 4 * l + b;
  if constexpr (BITS == 8) return p[64 * t + at];
  const int nibble = t < 4 ? p[64 * t + at] & 15 : p[64 * (t - 4) + at] >> 4;
  if constexpr (BITS == 4) {
    return nibble;
  } else {
    constexpr int H = BITS - 4, PER = 8 / H;  // high bits a register; registers a byte of high bits
    const int high = (p[256 + 64 * (t / PER) + at] >> (H * (t % PER))) & ((1 << H) - 1);
    return nibble | high << 4;
  }
}

// Outputs of one group of 16 weight rows (`valid` of them real) for MB rows of x from m0 (y row
// stride N). Q4: <w, x> = sum_g s d (q_w . q_x) + o S; Q8: sum_g d (s_lo (.)_lo + s_hi (.)_hi), the
// bias of the unsigned bytes (q + 2^(BITS-1)) subtracted in integers; ONE (one scale a block): sum_g
// d s (q_w . q_x).
template <int BITS, typename Scale, bool ONE = false>
void group_tile(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0, int MB) {
  constexpr bool Q4 = BITS == 4;
  constexpr int bias = Q4 ? 0 : 8 - BITS;  // 128 sum(x) >> bias is the bias of the bytes' sums
  for (int m = 0; m < MB; ++m) {
    for (int l = 0; l < valid; ++l) {
      float acc = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = wq + g * BITS * 64;
        const int64_t xi = (m0 + m) * G + g;
        const int8_t* xb = xq + xi * 32;
        int32_t sums[2] = {0, 0};  // weights 0..15 (registers 0..3), 16..31 (4..7)
        for (int t = 0; t < 8; ++t)
          for (int b = 0; b < 4; ++b) sums[t / 4] += weight<BITS>(p, t, l, b) * xb[4 * t + b];
        float s0, s1;
        lane_scales<ONE>(ws, g, l, s0, s1);
        const float d = xd[xi];
        if constexpr (Q4) {
          acc = std::fma(static_cast<float>(sums[0] + sums[1]), s0 * d, acc);
          acc = std::fma(s1, xS[xi], acc);
        } else if constexpr (ONE) {
          const int32_t dot = sums[0] + sums[1] - ((xh[2 * xi] + xh[2 * xi + 1]) >> bias);
          acc = std::fma(static_cast<float>(dot), s0 * d, acc);
        } else {
          acc = std::fma(static_cast<float>(sums[0] - (xh[2 * xi] >> bias)), s0 * d, acc);
          acc = std::fma(static_cast<float>(sums[1] - (xh[2 * xi + 1] >> bias)), s1 * d, acc);
        }
      }
      y[(m0 + m) * N + r0 + l] = acc;
    }
  }
}

}  // namespace tile::ref

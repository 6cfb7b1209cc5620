// IEEE float16 <-> float32 in portable C++: the tiles' float16 scales (tile.h) and the KV cache at
// float16 (attention_row.h). Widening is exact; narrowing rounds to nearest, ties to even, as the
// hardware conversions (F16C's vcvtps2ph, ARM's fcvt) do, so a key stored on one ISA has the same bits
// on every other.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace half {

// float16 bits -> float, exactly (every float16 is a float32)
inline float to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 1023;
  uint32_t out;
  if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    out = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    out = sign;
  } else {  // subnormal: man * 2^-24, exact in float32
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::memcpy(&out, &v, 4);
    out |= sign;
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

// float -> float16 bits, rounded to nearest, ties to even (overflow to infinity, NaN stays NaN)
inline uint16_t from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (a >= 0x477ff000u) return sign | 0x7c00;  // 65520 and above round to infinity
  if (a < 0x38800000u) {                       // below 2^-14: a subnormal (or zero), man = f * 2^24
    float v;
    std::memcpy(&v, &a, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(v * 16777216.f));  // exact product; ties to even
  }
  const uint32_t r = a - 0x38000000u;  // the exponent rebiased (127 -> 15), mantissa still 23 bits
  return sign | static_cast<uint16_t>((r + 0xfffu + ((r >> 13) & 1)) >> 13);
}

}  // namespace half

// The small per-row ops between the matmuls (RMSNorm, SiLU-gated product), shared by kernels.cpp's
// per-op calls and stack.cpp's whole forward, so both give a row the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "vecmath.h"

namespace rowops {

// out [H] = x / rms(x) * w
inline void rms_norm_row(const float* x, const float* w, float* out, int64_t H, double eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < H; ++j) ss += x[j] * x[j];
  const float r = 1.f / std::sqrt(ss / H + static_cast<float>(eps));
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) out[j] = w[j] * (x[j] * r);
}

// x [H] += delta [H]
inline void add_row(float* x, const float* delta, int64_t H) {
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) x[j] += delta[j];
}

// o [I] = silu(g) * u, silu(g) = g / (1 + exp(-g)) with vecmath's exp
inline void silu_mul_row(const float* g, const float* u, float* o, int64_t I) {
  using namespace vecmath;
  int64_t j = 0;
  for (; j + L <= I; j += L) {
    const vec gv = load(g + j);
    store(o + j, gv / (1.f + vexp(-gv)) * load(u + j));
  }
  for (; j < I; ++j) o[j] = g[j] / (1.f + vexp(splat(-g[j]))[0]) * u[j];
}

}  // namespace rowops

// Float vectors of the machine's width for the fused kernels (attention.cpp, kernels.cpp): GCC
// vector extensions, a fixed-order lane sum and an exp polynomial, so that every caller rounds the
// same way on every row.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "half.h"

namespace vecmath {

#ifdef __AVX512F__
constexpr int L = 16;
#else
constexpr int L = 8;
#endif
using vec = float __attribute__((vector_size(4 * L)));
using veci = int32_t __attribute__((vector_size(4 * L)));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
// L float16 values (a KV cache at float16) widened, exactly: by the hardware where it converts
inline vec load(const uint16_t* p) {
  vec v;
#if defined(__AVX512F__)
  const __m512 r = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  std::memcpy(&v, &r, sizeof v);
#elif defined(__F16C__)
  const __m256 r = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::memcpy(&v, &r, sizeof v);
#else
  for (int i = 0; i < L; ++i) v[i] = half::to_float(p[i]);
#endif
  return v;
}
inline vec splat(float x) { return vec{} + x; }
// L int8 values widened to float, exactly (an int8 KV cache's row: attention_row.h); GCC turns a
// __builtin_convertvector of bytes into one scalar conversion a lane, so the widening is spelled out
inline vec load(const int8_t* p) {
  vec v;
#if defined(__AVX512F__)
  const __m512 r = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &r, sizeof v);
#elif defined(__AVX2__)
  const __m256 r = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  std::memcpy(&v, &r, sizeof v);
#elif defined(__ARM_NEON)
  const int16x8_t w = vmovl_s8(vld1_s8(p));
  const float32x4_t lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), hi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w)));
  std::memcpy(&v, &lo, sizeof lo);
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
#else
  for (int i = 0; i < L; ++i) v[i] = static_cast<float>(p[i]);
#endif
  return v;
}

// a * b + c rounded once, written out: a compiler may contract `a * b + c` differently in each place
// it inlines it, and callers that must agree to the bit (attention_row.h) cannot leave that open.
inline vec fma(vec a, vec b, vec c) {
#if defined(__AVX512F__) || defined(__FMA__)
#ifdef __AVX512F__
  __m512 x, y, z;
#else
  __m256 x, y, z;
#endif
  std::memcpy(&x, &a, sizeof x);
  std::memcpy(&y, &b, sizeof y);
  std::memcpy(&z, &c, sizeof z);
#ifdef __AVX512F__
  const __m512 r = _mm512_fmadd_ps(x, y, z);
#else
  const __m256 r = _mm256_fmadd_ps(x, y, z);
#endif
  vec out;
  std::memcpy(&out, &r, sizeof out);
  return out;
#else
  vec out;
  for (int i = 0; i < L; ++i) out[i] = std::fma(a[i], b[i], c[i]);
  return out;
#endif
}

inline float reduce(vec v) {  // the lanes' sum, in a fixed order
#ifdef __AVX512F__
  __m512 r;
  std::memcpy(&r, &v, sizeof r);
  return _mm512_reduce_add_ps(r);
#elif defined(__AVX2__)
  __m256 r;
  std::memcpy(&r, &v, sizeof r);
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
#else
  float t[L], s = 0.f;
  std::memcpy(t, &v, sizeof t);
  for (int i = 0; i < L; ++i) s += t[i];
  return s;
#endif
}

// exp(x) for x <= 88 (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial, times 2^n);
// 0 below -87 (so exp(-inf) = 0).
inline vec vexp(vec x) {
  const veci dead = x < -87.f;
  x = dead ? splat(-87.f) : (x > 88.f ? splat(88.f) : x);
  const vec n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round to nearest
  const vec r = x - n * 0.693359375f + n * 2.12194440e-4f;
  vec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const veci bits = (__builtin_convertvector(n, veci) + 127) << 23;
  vec two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return dead ? vec{} : p * two_n;
}

}  // namespace vecmath

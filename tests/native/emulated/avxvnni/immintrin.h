// Test-only: AVX-VNNI's 256-bit vpdpbusd emulated exactly with AVX2 (a widening loop), so that an AVX2
// CPU without AVX-VNNI runs the avxvnni microkernel's code against the reference (tests/test_tile_isa.py
// builds tile_check.cpp with this directory first on the include path and __AVXVNNI__ defined). The
// compiler's own intrinsics come first; only _mm256_dpbusd_avx_epi32 is replaced.
#pragma once

#include_next <immintrin.h>
#include <cstdint>

inline __m256i emulated_dpbusd_avx_epi32(__m256i acc, __m256i u, __m256i s) {  // acc + 4 u8 x s8 a lane
  alignas(32) uint8_t a[32];
  alignas(32) int8_t b[32];
  alignas(32) int32_t c[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), u);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), s);
  _mm256_store_si256(reinterpret_cast<__m256i*>(c), acc);
  for (int l = 0; l < 8; ++l)
    for (int j = 0; j < 4; ++j) c[l] += int32_t{a[4 * l + j]} * int32_t{b[4 * l + j]};
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
}
#define _mm256_dpbusd_avx_epi32 emulated_dpbusd_avx_epi32

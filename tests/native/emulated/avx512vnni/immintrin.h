// Test-only: the AVX-512 intrinsics that tile.h, attention_row.h and vecmath.h use, emulated in
// portable C++ by SIMDe (the simde-py package's headers), so that a CPU without AVX-512 runs the
// AVX-512 VNNI microkernel's code against the reference (tests/test_tile_isa.py builds tile_check.cpp
// and attention_check.cpp with this directory first on the include path and __AVX512*__ defined).
// The few intrinsics SIMDe 0.8.2 lacks follow, with the operation order of GCC's own definitions
// where the order sets the bits (_mm512_reduce_add_ps).
#pragma once

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <cstdint>

#include "simde/x86/avx512.h"

#ifndef _mm512_cvtepi32_epi8
inline simde__m128i _mm512_cvtepi32_epi8(simde__m512i a) {  // each int32's low byte
  const simde__m512i_private p = simde__m512i_to_private(a);
  simde__m128i_private r;
  for (int i = 0; i < 16; ++i) r.i8[i] = static_cast<int8_t>(p.i32[i]);
  return simde__m128i_from_private(r);
}
#endif

#ifndef _mm512_cvtepi8_epi32
inline simde__m512i _mm512_cvtepi8_epi32(simde__m128i a) {  // 16 int8 widened
  const simde__m128i_private p = simde__m128i_to_private(a);
  simde__m512i_private r;
  for (int i = 0; i < 16; ++i) r.i32[i] = p.i8[i];
  return simde__m512i_from_private(r);
}
#endif

#ifndef _mm512_reduce_add_epi32
inline int _mm512_reduce_add_epi32(simde__m512i a) {
  const simde__m512i_private p = simde__m512i_to_private(a);
  uint32_t s = 0;  // wraps as the hardware's adds do
  for (int i = 0; i < 16; ++i) s += static_cast<uint32_t>(p.i32[i]);
  return static_cast<int>(s);
}
#endif

#ifndef _mm512_reduce_add_ps
inline float _mm512_reduce_add_ps(simde__m512 a) {  // GCC's order: halves of 256, of 128, then pairs
  const simde__m512_private p = simde__m512_to_private(a);
  float h8[8], h4[4];
  for (int i = 0; i < 8; ++i) h8[i] = p.f32[8 + i] + p.f32[i];
  for (int i = 0; i < 4; ++i) h4[i] = h8[4 + i] + h8[i];
  return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}
#endif

// SIMDe 0.8.2 stores all 16 lanes (zeros where k is clear); the instruction leaves those bytes alone
#undef _mm512_mask_storeu_ps
inline void _mm512_mask_storeu_ps(void* p, simde__mmask16 k, simde__m512 a) {
  const simde__m512_private v = simde__m512_to_private(a);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) static_cast<float*>(p)[i] = v.f32[i];
}

#define SPECDECODE_EMULATED_ISA 1  // the vectors are SIMDe's structs, not registers (attention_row.h)

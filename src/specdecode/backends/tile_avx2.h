// tile.h's microkernel for 256-bit AVX2 (AMD Zen 1-3, Intel client chips), and for AVX-VNNI (Intel
// Alder Lake on, Zen 5) where the build has it. A group's 16 rows are worked as two halves of 8, each
// half of a register t's 64 bytes (rows 8h..8h+7) one ymm: a block of 32 weights of 8 rows is
// unpacked once into 8 registers, then each row of x costs, per register, a broadcast of its 4
// activation bytes and one multiply-add of bytes (AVX-VNNI: vpdpbusd; AVX2: vpmaddubsw, whose 16-bit
// sums are added up as far as they cannot overflow, then widened by one vpmaddwd), and per block one
// conversion and one or two FMAs for 8 outputs.
//
// The integer sums are exact on every path, so the floats that follow are those of tile_ref.h.
// maddubs multiplies unsigned by signed bytes and adds pairs to a saturating int16: q4 (0..15),
// q5 (0..31) and q6 (0..63) bytes fit, 8, 4 and 2 registers summed in int16 (|sum| <= 32,004); q8's
// q + 128 does not, so its bytes go back to q and multiply as |q| by x with q's sign (|q| <= 128).
#pragma once

#include <immintrin.h>

#include <cstdlib>

namespace tile::avx2 {

#if defined(__AVXVNNI__)
constexpr bool VNNI = true;
#else
constexpr bool VNNI = false;
#endif

inline __m256 scales8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 scales8(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 int8s(const uint8_t* p) {  // 8 int8 -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// block g's two scale vectors for rows 8h..8h+7 of a group's scales
template <bool ONE, typename Scale>
inline void block_scales(const Scale* ws, int64_t g, int h, __m256& s0, __m256& s1) {
  if constexpr (std::is_same_v<Scale, uint8_t>) {
    const uint8_t* sb = ws + (g >> 3) * FACTORED;
    const auto* f = reinterpret_cast<const f16*>(sb);
    const uint8_t* c = sb + 4 * R + (g & 7) * 2 * R;
    s0 = _mm256_mul_ps(scales8(f + 8 * h), int8s(c + 8 * h));
    s1 = _mm256_mul_ps(scales8(f + R + 8 * h), int8s(c + R + 8 * h));
  } else {
    constexpr int64_t per = ONE ? 16 : 32;  // scales a block
    s0 = scales8(ws + g * per + 8 * h), s1 = ONE ? s0 : scales8(ws + g * per + 16 + 8 * h);
  }
}

// 16 int16 sums of two products each, of u's bytes (SIGNED: q, multiplied as |q| with x's sign
// moved over) by x's
template <bool SIGNED>
[[gnu::always_inline]] inline __m256i product(__m256i u, __m256i x) {
  return SIGNED ? _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(x, u)) : _mm256_maddubs_epi16(u, x);
}

// init + the dot products of registers T0..T1-1 with x's 4 bytes each (xb[t]): 8 int32 lanes, 4
// products each. SIGNED: u holds q (signed), else unsigned bytes; CHUNK registers summed in int16.
template <int T0, int T1, int CHUNK, bool SIGNED>
inline __m256i dots(const __m256i* u, const int32_t* xb, __m256i init) {
  if constexpr (VNNI && !SIGNED) {
#if defined(__AVXVNNI__)
    for (int t = T0; t < T1; ++t) init = _mm256_dpbusd_avx_epi32(init, u[t], _mm256_set1_epi32(xb[t]));
#endif
    return init;
  } else {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = T0; c < T1; c += CHUNK) {
      __m256i s = _mm256_setzero_si256();
      for (int t = c; t < c + CHUNK; ++t) {
        const __m256i x = _mm256_set1_epi32(xb[t]);
        const __m256i p = product<SIGNED>(u[t], x);
        s = t == c ? p : _mm256_add_epi16(s, p);
        asm("" : "+x"(s));  // add each product as it comes (group_tile)
      }
      init = _mm256_add_epi32(init, _mm256_madd_epi16(s, ones));
    }
    return init;
  }
}

// Register t (0..7) of the 8 rows at p (a block's bytes + 32 h): q4's nibbles, q5/q6's nibbles with
// their high bits put back above them, q8's bytes (as q where SIGNED)
template <int BITS, bool SIGNED>
[[gnu::always_inline]] inline __m256i unpack_one(const uint8_t* p, int t) {
  const __m256i low = _mm256_set1_epi8(15);
  if constexpr (BITS == 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * t));
    return SIGNED ? _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80))) : u;
  } else {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * (t & 3)));
    __m256i u = t < 4 ? _mm256_and_si256(b, low) : _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    if constexpr (BITS == 5 || BITS == 6) {
      constexpr int H = BITS - 4, PER = 8 / H;
      const __m256i hbits = _mm256_set1_epi8(static_cast<char>(((1 << H) - 1) << 4));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256 + 64 * (t / PER)));
      const int at = H * (t % PER);  // its bits at `at` of hb's byte -> bits 4..4 + H - 1
      const __m256i moved = at < 4 ? _mm256_slli_epi16(hb, 4 - at) : at == 4 ? hb : _mm256_srli_epi16(hb, at - 4);
      u = _mm256_or_si256(u, _mm256_and_si256(moved, hbits));
    }
    return u;
  }
}

// A block's 8 registers for rows 8h..8h+7 (p: the block's bytes + 32 h); the loads that registers t
// and t + 4 share are one load once inlined
template <int BITS, bool SIGNED>
[[gnu::always_inline]] inline void unpack(const uint8_t* p, __m256i* u) {
  for (int t = 0; t < 8; ++t) u[t] = unpack_one<BITS, SIGNED>(p, t);
}

// acc[m] += block g's contribution to 8 outputs (rows 8h..) for row m0 + m of x, m < MB
template <int BITS, int MB, typename Scale, bool ONE>
[[gnu::always_inline]] inline void block_rows(const __m256i* u, const Scale* ws, int64_t g, int h, const int8_t* xq, const float* xd,
                       const float* xS, const int32_t* xh, int64_t G, int64_t m0, __m256* acc) {
  constexpr bool Q4 = BITS == 4, SIGNED = BITS == 8 && !VNNI;
  constexpr int CHUNK = BITS == 4 ? 8 : BITS == 5 ? 4 : BITS == 6 ? 2 : 1;
  constexpr int bias = Q4 ? 0 : 8 - BITS;  // q6 bytes are q + 32, q5's q + 16 (q8: q + 128): 128 sum(x) >> 2, 3
  __m256 s0, s1;
  block_scales<ONE>(ws, g, h, s0, s1);
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) {
    const int64_t xi = (m0 + m) * G + g;
    const auto* xb = reinterpret_cast<const int32_t*>(xq + xi * 32);
    const __m256 d = _mm256_set1_ps(xd[xi]);
    if constexpr (Q4) {
      const __m256i dot = dots<0, 8, CHUNK, false>(u, xb, _mm256_setzero_si256());
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s0, d), acc[m]);
      acc[m] = _mm256_fmadd_ps(s1, _mm256_set1_ps(xS[xi]), acc[m]);
    } else if constexpr (ONE) {
      const __m256i init = _mm256_set1_epi32(SIGNED ? 0 : -((xh[2 * xi] + xh[2 * xi + 1]) >> bias));
      const __m256i dot = dots<0, 8, CHUNK, SIGNED>(u, xb, init);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s0, d), acc[m]);
    } else {
      const __m256i lo = dots<0, 4, CHUNK, SIGNED>(u, xb, _mm256_set1_epi32(SIGNED ? 0 : -(xh[2 * xi] >> bias)));
      const __m256i hi = dots<4, 8, CHUNK, SIGNED>(u, xb, _mm256_set1_epi32(SIGNED ? 0 : -(xh[2 * xi + 1] >> bias)));
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(s0, d), acc[m]);
      acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(s1, d), acc[m]);
    }
  }
}

// y's 8 outputs of rows 8h.. (`rows` of them real) for MB rows of x from m0
template <int MB>
[[gnu::always_inline]] inline void store_rows(const __m256* acc, float* y, int64_t N, int64_t r0, int h, int64_t rows, int64_t m0) {
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rows)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int m = 0; m < MB; ++m) {
    float* out = y + (m0 + m) * N + r0 + 8 * h;
    if (rows == 8)
      _mm256_storeu_ps(out, acc[m]);
    else if (rows > 0)
      _mm256_maskstore_ps(out, keep, acc[m]);
  }
}

// s[m] (int32) += the products of registers T0..T1-1 of both halves (u at p and p + 32) with row m's
// x bytes: each register unpacked once and each broadcast of x serving both halves
template <int BITS, int MB, int T0, int T1>
[[gnu::always_inline]] inline void both_dots(const uint8_t* p, const int32_t* const* xb, __m256i (*s)[MB]) {
  constexpr bool SIGNED = BITS == 8 && !VNNI;
  constexpr int CHUNK = BITS == 4 ? 8 : BITS == 5 ? 4 : BITS == 6 ? 2 : 1;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i w[2][MB];
#pragma GCC unroll 8
  for (int t = T0; t < T1; ++t) {
    const __m256i u0 = unpack_one<BITS, SIGNED>(p, t), u1 = unpack_one<BITS, SIGNED>(p + 32, t);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256i x = _mm256_set1_epi32(xb[m][t]);
      if constexpr (VNNI && !SIGNED) {
#if defined(__AVXVNNI__)
        s[0][m] = _mm256_dpbusd_avx_epi32(t == T0 ? _mm256_setzero_si256() : s[0][m], u0, x);
        s[1][m] = _mm256_dpbusd_avx_epi32(t == T0 ? _mm256_setzero_si256() : s[1][m], u1, x);
#endif
      } else {
        const __m256i p0 = product<SIGNED>(u0, x), p1 = product<SIGNED>(u1, x);
        const bool first = (t - T0) % CHUNK == 0, last = (t - T0) % CHUNK == CHUNK - 1 || t == T1 - 1;
        w[0][m] = first ? p0 : _mm256_add_epi16(w[0][m], p0);
        w[1][m] = first ? p1 : _mm256_add_epi16(w[1][m], p1);
        asm("" : "+x"(w[0][m]), "+x"(w[1][m]));  // add each product as it comes (group_tile)
        if (last) {
          const __m256i d0 = _mm256_madd_epi16(w[0][m], ones), d1 = _mm256_madd_epi16(w[1][m], ones);
          s[0][m] = t - T0 < CHUNK ? d0 : _mm256_add_epi32(s[0][m], d0);
          s[1][m] = t - T0 < CHUNK ? d1 : _mm256_add_epi32(s[1][m], d1);
        }
      }
    }
  }
}

// Block g's contribution to both halves' outputs for MS rows of x from m0 (acc0 / acc1: their
// accumulators, halves 0 and 1): the products of both_dots, the bias of q5/q6/q8's bytes added after
// them (the same int32 sums), then the block's float work
template <int BITS, int MS, typename Scale, bool ONE>
[[gnu::always_inline]] inline void both_block(const uint8_t* p, const Scale* ws, int64_t g, const int8_t* xq, const float* xd,
                                              const float* xS, const int32_t* xh, int64_t G, int64_t m0, __m256* acc0,
                                              __m256* acc1) {
  constexpr bool Q4 = BITS == 4;
  constexpr int bias = Q4 ? 0 : 8 - BITS;
  __m256* acc[2] = {acc0, acc1};
  const int32_t* xb[MS];
  for (int m = 0; m < MS; ++m) xb[m] = reinterpret_cast<const int32_t*>(xq + ((m0 + m) * G + g) * 32);
  if constexpr (Q4 || ONE) {
    __m256i s[2][MS];
    both_dots<BITS, MS, 0, 8>(p, xb, s);
    if constexpr (!Q4 && !(BITS == 8 && !VNNI))
      for (int m = 0; m < MS; ++m) {
        const int64_t xi = (m0 + m) * G + g;
        const __m256i b = _mm256_set1_epi32(-((xh[2 * xi] + xh[2 * xi + 1]) >> bias));
        s[0][m] = _mm256_add_epi32(s[0][m], b), s[1][m] = _mm256_add_epi32(s[1][m], b);
      }
    for (int h = 0; h < 2; ++h) {
      __m256 s0, s1;
      block_scales<ONE>(ws, g, h, s0, s1);
      for (int m = 0; m < MS; ++m) {
        const int64_t xi = (m0 + m) * G + g;
        const __m256 d = _mm256_set1_ps(xd[xi]);
        acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h][m]), _mm256_mul_ps(s0, d), acc[h][m]);
        if constexpr (Q4) acc[h][m] = _mm256_fmadd_ps(s1, _mm256_set1_ps(xS[xi]), acc[h][m]);
      }
    }
  } else {
    __m256i lo[2][MS], hi[2][MS];
    both_dots<BITS, MS, 0, 4>(p, xb, lo);
    both_dots<BITS, MS, 4, 8>(p, xb, hi);
    if constexpr (!(BITS == 8 && !VNNI))
      for (int m = 0; m < MS; ++m) {
        const int64_t xi = (m0 + m) * G + g;
        const __m256i bl = _mm256_set1_epi32(-(xh[2 * xi] >> bias));
        const __m256i bh = _mm256_set1_epi32(-(xh[2 * xi + 1] >> bias));
        lo[0][m] = _mm256_add_epi32(lo[0][m], bl), lo[1][m] = _mm256_add_epi32(lo[1][m], bl);
        hi[0][m] = _mm256_add_epi32(hi[0][m], bh), hi[1][m] = _mm256_add_epi32(hi[1][m], bh);
      }
    for (int h = 0; h < 2; ++h) {
      __m256 s0, s1;
      block_scales<ONE>(ws, g, h, s0, s1);
      for (int m = 0; m < MS; ++m) {
        const __m256 d = _mm256_set1_ps(xd[(m0 + m) * G + g]);
        acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[h][m]), _mm256_mul_ps(s0, d), acc[h][m]);
        acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[h][m]), _mm256_mul_ps(s1, d), acc[h][m]);
      }
    }
  }
}

// The rows of x group_both works a block for at a time, of `left` still to do: all of them up to 6
// (their sums spill from 5, yet at 5 and 6 rows one set beat 3 + 2 and 3 + 3 by ~4% on AVX2), else 4,
// whose int16 and int32 sums stay in registers beside the two of weights. AVX2's Q6_K (int16 sums of a
// product pair, int32 sums beside them) takes sets of at most 4.
template <int BITS>
constexpr int set_rows(int left) {
  if constexpr (BITS == 6 && !VNNI) return left < 4 ? left : 4;
  return left <= 6 ? left : 4;
}

// block g for the sets of rows M0.. of MB (each set re-unpacks the block, from L1)
template <int BITS, int MB, int M0, typename Scale, bool ONE>
[[gnu::always_inline]] inline void both_sets(const uint8_t* p, const Scale* ws, int64_t g, const int8_t* xq, const float* xd,
                                             const float* xS, const int32_t* xh, int64_t G, int64_t m0, __m256 (*acc)[MB]) {
  constexpr int S = set_rows<BITS>(MB - M0);
  both_block<BITS, S, Scale, ONE>(p, ws, g, xq, xd, xS, xh, G, m0 + M0, acc[0] + M0, acc[1] + M0);
  if constexpr (M0 + S < MB) both_sets<BITS, MB, M0 + S, Scale, ONE>(p, ws, g, xq, xd, xS, xh, G, m0, acc);
}

// One sweep over a group's blocks for MB rows of x (group_tile's first way): both halves at once, a
// register at a time, a block worked for the sets of rows of set_rows in turn
template <int BITS, int MB, typename Scale, bool ONE>
void group_both(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0,
                const uint8_t* next, int pass, int passes) {
  constexpr int64_t bytes = BITS * 64;
  __m256 acc[2][MB];
  for (int h = 0; h < 2; ++h)
    for (int m = 0; m < MB; ++m) acc[h][m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* p = wq + g * bytes;
    if (pass == 0)
      for (int i = 0; i < BITS; ++i) prefetch(p + PREFETCH + 64 * i);
    if (next != nullptr)
      for (int i = pass; i < BITS; i += passes)
        prefetch(next + g * bytes + 64 * i);
    both_sets<BITS, MB, 0, Scale, ONE>(p, ws, g, xq, xd, xS, xh, G, m0, acc);
  }
  for (int h = 0; h < 2; ++h) store_rows<MB>(acc[h], y, N, r0, h, std::min<int64_t>(8, valid - 8 * h), m0);
}

// Outputs of one group of 16 weight rows for MB rows of x from m0 (tile_ref.h's group_tile), in pass
// `pass` of `passes`; next: the next group's weights or null. Two ways, by the rows of x in a pass:
//
// - At most both_rows rows (a decode step, a chain of up to 11 drafts): group_both, one sweep over the
//   group's blocks that works both halves of its rows a register at a time. Each register of weights
//   is unpacked once a set of rows and each broadcast of x serves both halves; up to 4 rows the live
//   set (two registers of weights, 2 MB int16 sums, 2 MB accumulators) fits 16 registers, where a
//   whole block's 8 registers of both halves did not (GCC spilled a third of the loop to the stack).
//   At 5 and 6 rows the sums spill to L1, and one set still beats two; from 7 rows a block is worked
//   for sets of 4 in turn (set_rows), each unpacking it again from L1, so that no sum spills.
// - More rows: the group is swept 2 x passes times, a half of its rows each, a block's 8 registers
//   unpacked once per sweep and shared by up to MAX_X (12) rows; only the first sweep reads the group from
//   memory, the others find it in cache. Each sweep also prefetches its share of the next group's
//   lines (line i of block g in sweep i % sweeps), so that memory streams while any sweep computes:
//   with the first sweep alone prefetching, T(4) of the 1.5B was T(1) plus the other sweeps' compute.
//
// In both, each int16 sum takes its product as it comes (an empty asm keeps GCC from holding all of a
// block's products in registers and on the stack first). Measured on Zen 3 (docs/native_forward.md):
// llvm-mca, Q4_K with 4 rows of x 29 -> 19 cycles a row and block of 16 weight rows; one thread from
// L2, Q4_K 4 rows ~11 -> 8 ns, Q6_K 1 row 24 -> 21 ns but 2 rows 17 -> 18; the 1.5B's T(4) 98 -> 86 ms.
// Without VNNI, Q6_K's int16 sums take a product pair each (CHUNK 2), so its 4 rows hold int32 sums
// beside the int16 ones and outgrow the registers. Whether 4 rows of Q6_K still sweep once depends on
// the core (scripts/tile_stream.cpp, 2 threads, 450 MB): by halves was faster on a Zen 5 through the ISA
// switch (18.7-19.1 -> 16.6-17.0 ms) and slower on the Xeon below (32.0-32.4 -> 41.6-43.1 ms), whose
// ports are those of Intel's AVX2 client cores; there they sweep once, and so do 5 and 6 rows, in sets of 4,
// while on AMD's cores by halves took fewer cycles (halves_sooner below, opt-in)
// (the Xeon, 450 MB of Q6_K, three interleaved rounds: 5 / 6 rows 41.0 / 42.8 ms by halves, 32.4 / 37.3
// in sets of 4, 31.0 / 36.5 in sets of 2; from 8 rows by halves, 9 / 12 rows 49.3 / 60.1 against
// 55.9 / 72.9 in sets of 4).
// Passes: a call of at most 12 rows takes one sweep of group_both for Q4 (and, with VNNI, for every
// kind); a longer call passes of at most 6. With passes of
// 4, the verification of 4 drafts (5 rows) swept each group twice: on a Xeon (family 6 model 167,
// 2 threads, scripts/tile_stream.cpp over 300 MB of Q4_K), AVX2 5 / 6 / 9 rows took 29.3 / 34 / 43.6
// ms in passes of 4 and 21.6 / 25.2 / 40.7 in one sweep of up to 8 (9: 5 + 4), 8 rows level
// (38.5 / 37.7); AVX-VNNI 26.3 / 28.5 / 31.5 / 34 (5 / 6 / 8 / 9 rows) -> 18.9 / 20.6 / 29.0 / 33.7
// and its Q6_K 39.6 / 41.8 / 48 / 57 -> 27.9 / 33 / 43.2 / 51.5. At 16 rows (a prefill's passes),
// passes of 8 lost 6-11%, passes of 6 did not.
// Sets of 4 from 7 rows, and one sweep up to 12 (the same Xeon, three interleaved rounds, medians;
// docs/results/tile_stream_avx2_sets_of_4_rows_one_sweep_up_to_12_xeon_amx_2threads.json): Q4_K 8 / 9
// rows AVX2 38.4 / 41.4 -> 35.0 / 38.5 ms, AVX-VNNI 28.5 / 32.1 -> 24.0 / 28.7; Q6_K 9 / 12 rows AVX2
// 72.3 / 83.3 -> 56.5 / 71.3, AVX-VNNI 51.2 / 64.9 -> 43.2 / 53.7; 7 and 12 rows of Q4_K level. One
// sweep up to 16 (4 sets) lost at 16 rows of Q4_K with VNNI (48.8 -> 56.8), so 16 go in passes of 6.
constexpr int BOTH = 12;
template <int BITS, bool ONE>
constexpr bool sweeps_both() {  // whether one sweep takes passes of up to BOTH rows
  return VNNI || (BITS == 4 && !ONE);
}
template <int BITS, bool ONE>
constexpr int both_rows() {  // the most rows of x group_both takes
  if constexpr (sweeps_both<BITS, ONE>()) return BOTH;
  if constexpr (BITS == 6 && !ONE) return 6;  // AVX2's Q6_K: up to 6 rows in sets of 4 beat two sweeps
  return 4;  // AVX2's q5/q8 (int16 sums of fewer products) and its ONE matrices
}

// Which way wins past a few rows depends on the core, not only the ISA. On AMD's cores AVX2's
// half-sweeps (a block's 8 registers unpacked once and shared by every row of x) beat group_both's
// sets from 4 rows of Q6_K and from 6 of Q4_K; on the Xeon above the sets won. A Zen 5 through the
// ISA switch (scripts/tile_stream.cpp, one thread from L2, cycles a row and block of 16 x 32, 2026-12-01):
// Q6_K 4 / 5 / 6 rows 14.8-15.3 / 14.0-14.6 / 14.9-15.3 in sets, 12.5-12.9 / 11.7-12.0 / 11.4-11.7 by
// halves (1-3 rows: sets 15-21, halves 15-27); Q4_K 6 / 8 / 9 rows 8.1 / 8.2-9.7 / 8.1-8.8 in sets,
// 7.7 / 7.5 / 7.3 by halves (4 rows 8.2 against 8.5). Without VNNI only (AVX-VNNI's vpdpbusd needs
// no int16 sums); the same bits either way. Opt-in (SPECDECODE_AVX2_HALVES=1; tile_check tests both
// ways): end to end the default drafter through the AVX2 switch ran 1.16x / 1.16x plain with sets
// against 1.08x / 1.10x by halves (heldout:3, two alternating rounds), so the T(n) gain did not carry.
inline bool halves_sooner = [] {
  const char* env = std::getenv("SPECDECODE_AVX2_HALVES");
  return env != nullptr && *env == '1';
}();
template <int BITS, bool ONE>
constexpr int halves_from() {  // with halves_sooner, the rows of x from which a group is swept by halves
  if constexpr (!VNNI && !ONE && BITS == 6) return 4;
  if constexpr (!VNNI && !ONE && BITS == 4) return 6;
  return both_rows<BITS, ONE>() + 1;
}
// the most rows of x a pass over a group takes, for a call of M rows (tile.h's groups)
template <int BITS, bool ONE>
inline int64_t rows_a_pass(int64_t M) {
  if constexpr (sweeps_both<BITS, ONE>()) return M <= BOTH ? BOTH : 6;
  if constexpr (ONE) return both_rows<BITS, ONE>();  // passes group_both takes whole
  return MAX_X;
}
template <int BITS, int MB, typename Scale, bool ONE = false>
void group_tile(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0,
                const uint8_t* next, int pass, int passes) {
  if constexpr (MB <= both_rows<BITS, ONE>()) {
    if (MB < halves_from<BITS, ONE>() || !halves_sooner)
      return group_both<BITS, MB, Scale, ONE>(wq, ws, xq, xd, xS, xh, y, G, N, r0, valid, m0, next, pass, passes);
  }
  {  // by halves
    constexpr bool SIGNED = BITS == 8 && !VNNI;
    constexpr int64_t bytes = BITS * 64;
    const int sweeps = 2 * passes;
    for (int h = 0; h < 2 && 8 * h < valid; ++h) {
      const int sweep = 2 * pass + h;
      __m256 acc[MB];
      for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
      for (int64_t g = 0; g < G; ++g) {
        const uint8_t* p = wq + g * bytes + 32 * h;
        if (h == 0 && pass == 0)  // the block PREFETCH bytes ahead (tile_avx512.h)
          for (int i = 0; i < BITS; ++i) prefetch(p + PREFETCH + 64 * i);
        if (next != nullptr)
          for (int i = sweep; i < BITS; i += sweeps)
            prefetch(next + g * bytes + 64 * i);
        __m256i u[8];
        unpack<BITS, SIGNED>(p, u);
        block_rows<BITS, MB, Scale, ONE>(u, ws, g, h, xq, xd, xS, xh, G, m0, acc);
      }
      store_rows<MB>(acc, y, N, r0, h, std::min<int64_t>(8, valid - 8 * h), m0);
    }
  }
}

}  // namespace tile::avx2

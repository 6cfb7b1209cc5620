// Quantized weights times 8-bit activations (llama.cpp's design), beside kernels.cpp's exact
// in-register dequantization: each row of x is quantized on its own, per block of 32, to
// q = round(x / d) with d = max|x| / 127 (and S = d * sum(q) for the 4-bit offsets); a block's dot
// product is then an integer sum, one multiply-add per 4 weights (AVX2 maddubs, or AVX-512 VNNI).
// A row's quantization and sums never depend on the other rows, so verifying k drafts still gives
// the bits of k single-token steps; the values differ from the float32 model's by the activation
// rounding.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "tiles.h"

#include <cmath>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// x [M, K] float32 -> q [M, K] int8, d [M, G], S [M, G] (G = K / 32)
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* S) {
  const int64_t G = K / 32;
  for (int64_t i = 0; i < M * G; ++i) {
    const float* b = x + i * 32;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(b[j]));
    const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(b[j] * inv));
      q[i * 32 + j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[i] = scale;
    S[i] = scale * static_cast<float>(sum);
  }
}

// The 32 weights of one block as bytes (Q4: 0..15 unsigned; Q8: signed) and their integer dot
// products with one quantized x block, as 8 int32 partial sums (4 weights each, in order).
#if defined(__AVX2__)
inline __m256i q4_weights(const uint8_t* p) {  // byte i low nibble = w_i, high = w_{i+16}
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
inline __m256i udot(__m256i u, __m256i s) {  // u: unsigned bytes, s: signed -> 8 int32
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
#endif

// y[m, r] for weight row r and MB rows of x from m0. Q4: per block scale s and offset o, so
// <w, x> = s d sum(q_w q_x) + o S; Q8: a scale per 16 weights, <w, x> = d (s0 sum_lo + s1 sum_hi).
template <bool Q4, int MB>
void tile_i8(const uint8_t* wq, const float* ws, const int8_t* xq, const float* xd, const float* xS, float* y,
             int64_t G, int64_t N, int64_t r, int64_t m0) {
  const int64_t bytes = Q4 ? 16 : 32;
#if defined(__AVX2__)
  __m256 acc[MB];
  float off[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps(), off[m] = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* p = wq + (r * G + g) * bytes;
    const float s0 = ws[2 * (r * G + g)], s1 = ws[2 * (r * G + g) + 1];
    __m256i w = Q4 ? q4_weights(p) : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i sign = w;
    if (!Q4) w = _mm256_sign_epi8(w, w);  // |w| as unsigned bytes; x takes w's sign below
    // Q4: s0 in every lane; Q8: s0 in the lanes of weights 0..15, s1 in those of 16..31
    const __m256 scale = Q4 ? _mm256_set1_ps(s0)
                            : _mm256_permutevar8x32_ps(_mm256_castpd_ps(_mm256_broadcast_sd(
                                                           reinterpret_cast<const double*>(ws + 2 * (r * G + g)))),
                                                       _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const int64_t xi = (m0 + m) * G + g;
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + xi * 32));
      if (!Q4) xv = _mm256_sign_epi8(xv, sign);
      const __m256 dot = _mm256_cvtepi32_ps(udot(w, xv));
      acc[m] = _mm256_fmadd_ps(dot, _mm256_mul_ps(scale, _mm256_set1_ps(xd[xi])), acc[m]);
      if (Q4) off[m] += s1 * xS[xi];
    }
  }
  for (int m = 0; m < MB; ++m) {
    float t[8];
    _mm256_storeu_ps(t, acc[m]);
    y[(m0 + m) * N + r] = (((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]))) + off[m];
  }
#else
  for (int m = 0; m < MB; ++m) {
    float total = 0.f;
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t* p = wq + (r * G + g) * bytes;
      const int64_t xi = (m0 + m) * G + g;
      const int8_t* xb = xq + xi * 32;
      const float s0 = ws[2 * (r * G + g)], s1 = ws[2 * (r * G + g) + 1];
      int lo = 0, hi = 0;
      for (int j = 0; j < 16; ++j) {
        const int a = Q4 ? (p[j] & 15) : static_cast<int8_t>(p[j]);
        const int b = Q4 ? (p[j] >> 4) : static_cast<int8_t>(p[j + 16]);
        lo += a * xb[j];
        hi += b * xb[j + 16];
      }
      total += Q4 ? s0 * xd[xi] * static_cast<float>(lo + hi) + s1 * xS[xi]
                  : xd[xi] * (s0 * static_cast<float>(lo) + s1 * static_cast<float>(hi));
    }
    y[(m0 + m) * N + r] = total;
  }
#endif
}

template <bool Q4>
torch::Tensor matmul_i8(const torch::Tensor& x, const torch::Tensor& scales, const torch::Tensor& quants) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2,
              "x: expected a contiguous CPU float32 [M, K] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = quants.size(0), G = K / 32;
  TORCH_CHECK(K % 32 == 0, "quantized linear: x.size(1) must be a multiple of 32");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat32 && scales.is_contiguous() && scales.dim() == 3 &&
                  scales.size(0) == N && scales.size(1) == G && scales.size(2) == 2,
              "scales: expected a contiguous float32 [N, K / 32, 2] tensor");
  TORCH_CHECK(quants.is_contiguous() && quants.dim() == 2 && quants.size(1) == G * (Q4 ? 16 : 32) &&
                  quants.scalar_type() == (Q4 ? torch::kUInt8 : torch::kInt8),
              "quants: expected a contiguous [N, K / 32 * ", Q4 ? 16 : 32, "] tensor of ", Q4 ? "uint8" : "int8");
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto xd = torch::empty({M, G}, x.options()), xS = torch::empty({M, G}, x.options());
  quantize_rows(x.data_ptr<float>(), M, K, xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xS.data_ptr<float>());
  auto y = torch::empty({M, N}, x.options());
  const auto* wq = static_cast<const uint8_t*>(quants.data_ptr());
  const float *ws = scales.data_ptr<float>(), *d = xd.data_ptr<float>(), *S = xS.data_ptr<float>();
  const int8_t* q = xq.data_ptr<int8_t>();
  float* yp = y.data_ptr<float>();
  for_tiles(M, N, K, [&](auto mb, int64_t r, int64_t m0) { tile_i8<Q4, decltype(mb)::value>(wq, ws, q, d, S, yp, G, N, r, m0); });
  return y;
}

}  // namespace

// x: [M, K] float32, each row quantized to 8 bits per block of 32; 4-bit rows (scale, offset per
// 32 weights) -> x W^T [M, N] float32
torch::Tensor linear_q4_i8(torch::Tensor x, torch::Tensor scales, torch::Tensor quants) {
  return matmul_i8<true>(x, scales, quants);
}

// The same for 8-bit rows (a scale per 16 weights)
torch::Tensor linear_q8_i8(torch::Tensor x, torch::Tensor scales, torch::Tensor quants) {
  return matmul_i8<false>(x, scales, quants);
}

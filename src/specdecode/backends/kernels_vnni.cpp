// `--dtype gguf` matmuls on AVX-512 VNNI: weight rows interleaved 16 at a time, so that one
// vpdpbusd yields partial sums for 16 weight rows and each unpacked block serves every row of x.
//
// Why: kernels_i8.cpp forms one weight row's dot product with each x row in turn (a 256-bit dot,
// a conversion and an FMA per 32 weights per row of x, a horizontal sum per output). Verifying k
// drafts then pays almost a full pass per extra row (r(8) = 3.4 on Zen 4). Here a block of 32
// weights of 16 rows is 4 registers of nibbles, unpacked once into 8 registers; each row of x then
// costs 8 vpdpbusd with its 4 activation bytes broadcast from memory, one conversion and two FMAs
// for 16 outputs, and no horizontal sums (ggml's repacked Q4_0x8 and ik_llama.cpp's unpackers are
// the idea; the layout and code are ours).
//
// Layout (pack_*): rows in groups of 16 (the last group zero-padded); per group and block of 32:
//   q4: 4 x 64 bytes; register t holds, for row l, the 4 bytes t*4..t*4+3 of its block as the file
//       stores them (weight j in byte j's low nibble, j + 16 in its high), so its low nibbles are
//       weights 4t..4t+3 and its high nibbles weights 16+4t..16+4t+3: registers U_0..U_7 cover the
//       block 4 weights at a time, in order.
//   q8: 8 x 64 bytes, register t: weights 4t..4t+3 of row l, plus 128 (vpdpbusd multiplies unsigned
//       by signed bytes; 128 * sum(x) is subtracted back exactly, in integers).
//   scales [groups, G, 2, 16]: q4 (s, o) of the 16 rows, q8 (s of weights 0..15, of 16..31); float16
//       where that holds them exactly (the fp16 d and m of Q4_0/Q4_1/Q5_0/Q8_0: 14% fewer bytes per
//       step), else float32 (K-quants' sub-block scales).
// Invariant, as in kernels_i8.cpp: each row of x is quantized on its own (the same bytes as there)
// and its sums are formed in the same order whatever the other rows: verifying k drafts gives the
// bits of k single-token steps, and a batch gives each request the bits it gets alone.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPECDECODE_VNNI 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t R = 16;      // weight rows per group (one int32 lane each)
constexpr int64_t MAX_X = 8;   // rows of x per pass over a group's blocks

// x [M, K] float32 -> q [M, K] int8, d [M, G] (scale), S [M, G] (d * sum q), h [M, G, 2] (sums of
// q over weights 0..15 and 16..31, times 128: the q8 bias to subtract). The bytes are those of
// kernels_i8.cpp's quantize_rows: q = nearbyint(x * 127 / max|x|), d = max|x| / 127.
void quantize(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* S, int32_t* h) {
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
// Outputs of one group of 16 weight rows for MB rows of x from m0 (y row stride N, `valid` of the
// 16 rows real). Q4: <w, x> = sum_g s d (q_w . q_x) + o S; Q8: sum_g d (s_lo (.)_lo + s_hi (.)_hi).
inline __m512 scales16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 scales16(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

template <bool Q4, int MB, typename Scale>
void group_tile(const uint8_t* wq, const Scale* ws, const int8_t* xq, const float* xd, const float* xS,
                const int32_t* xh, float* y, int64_t G, int64_t N, int64_t r0, int64_t valid, int64_t m0) {
  constexpr int64_t bytes = Q4 ? 256 : 512;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(15);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* p = wq + g * bytes;
    __m512i u[8];
    if constexpr (Q4) {
      for (int t = 0; t < 4; ++t) {
        const __m512i b = _mm512_loadu_si512(p + 64 * t);
        u[t] = _mm512_and_si512(b, low);
        u[t + 4] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
      }
    } else {
      for (int t = 0; t < 8; ++t) u[t] = _mm512_loadu_si512(p + 64 * t);
    }
    const __m512 s0 = scales16(ws + g * 32), s1 = scales16(ws + g * 32 + 16);
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
      } else {
        __m512i lo = _mm512_set1_epi32(-xh[2 * xi]), hi = _mm512_set1_epi32(-xh[2 * xi + 1]);
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

template <bool Q4>
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& scales, const torch::Tensor& quants, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2,
              "x: expected a contiguous CPU float32 [M, K] tensor");
  const int64_t M = x.size(0), K = x.size(1), G = K / 32, groups = (N + R - 1) / R;
  TORCH_CHECK(K % 32 == 0, "interleaved linear: x.size(1) must be a multiple of 32");
  TORCH_CHECK(quants.is_contiguous() && quants.dim() == 3 && quants.size(0) == groups && quants.size(1) == G &&
                  quants.size(2) == (Q4 ? 256 : 512) && quants.scalar_type() == torch::kUInt8,
              "quants: expected a contiguous uint8 [ceil(N / 16), K / 32, ", Q4 ? 256 : 512, "] tensor");
  const bool half = scales.scalar_type() == torch::kHalf;
  TORCH_CHECK(scales.is_contiguous() && (half || scales.scalar_type() == torch::kFloat32) && scales.dim() == 4 &&
                  scales.size(0) == groups && scales.size(1) == G && scales.size(2) == 2 && scales.size(3) == R,
              "scales: expected a contiguous float32 or float16 [ceil(N / 16), K / 32, 2, 16] tensor");
#if SPECDECODE_VNNI
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto xd = torch::empty({M, G}, x.options()), xS = torch::empty({M, G}, x.options());
  auto xh = torch::empty({M, G, 2}, x.options().dtype(torch::kInt32));
  quantize(x.data_ptr<float>(), M, K, xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xS.data_ptr<float>(),
           xh.data_ptr<int32_t>());
  auto y = torch::empty({M, N}, x.options());
  const auto* wq = quants.data_ptr<uint8_t>();
  const float *d = xd.data_ptr<float>(), *S = xS.data_ptr<float>();
  const int8_t* q = xq.data_ptr<int8_t>();
  const int32_t* h = xh.data_ptr<int32_t>();
  float* yp = y.data_ptr<float>();
  auto run = [&](auto* ws) {
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t grp = g0; grp < g1; ++grp) {
      const uint8_t* gw = wq + grp * G * (Q4 ? 256 : 512);
      const auto* gs = ws + grp * G * 32;
      const int64_t valid = std::min(R, N - grp * R);
      for (int64_t m0 = 0; m0 < M;) {
        const int64_t left = M - m0, passes = (left + MAX_X - 1) / MAX_X, mb = (left + passes - 1) / passes;
        switch (mb) {
#define TILE(n) \
  case n: group_tile<Q4, n>(gw, gs, q, d, S, h, yp, G, N, grp * R, valid, m0); break;
          TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8)
#undef TILE
        }
        m0 += mb;
      }
    }
  });
  };
  if (half)
    run(scales.data_ptr<at::Half>());
  else
    run(scales.data_ptr<float>());
  return y;
#else
  TORCH_CHECK(false, "interleaved linear: this build has no AVX-512 VNNI");
#endif
}

// Old layout (gguf_weights.QuantMatrix: scales [N, G, 2], quants [N, G * 16] uint8 or [N, G * 32]
// int8) <-> interleaved. A block's bytes move as 4-byte words: word t of row l's block lands in
// lane l of register t.
template <bool Q4>
std::vector<torch::Tensor> pack(const torch::Tensor& scales, const torch::Tensor& quants) {
  const int64_t N = quants.size(0), G = scales.size(1), words = Q4 ? 4 : 8, groups = (N + R - 1) / R;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == torch::kFloat32 && scales.dim() == 3 &&
                  scales.size(0) == N && scales.size(2) == 2,
              "scales: expected a contiguous float32 [N, K / 32, 2] tensor");
  TORCH_CHECK(quants.is_contiguous() && quants.dim() == 2 && quants.size(1) == G * words * 4 &&
                  quants.element_size() == 1,
              "quants: expected a contiguous [N, K / 32 * ", words * 4, "] byte tensor");
  auto pq = torch::zeros({groups, G, words * 64}, torch::kUInt8);
  auto ps = torch::zeros({groups, G, 2, R}, torch::kFloat32);
  const auto* src = static_cast<const uint32_t*>(quants.data_ptr());
  const float* s = scales.data_ptr<float>();
  auto* dst = reinterpret_cast<uint32_t*>(pq.data_ptr<uint8_t>());
  float* sd = ps.data_ptr<float>();
  const uint32_t bias = Q4 ? 0u : 0x80808080u;
  at::parallel_for(0, N, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t grp = r / R, l = r % R;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t t = 0; t < words; ++t) dst[((grp * G + g) * words + t) * R + l] = src[(r * G + g) * words + t] ^ bias;
        for (int64_t i = 0; i < 2; ++i) sd[((grp * G + g) * 2 + i) * R + l] = s[(r * G + g) * 2 + i];
      }
    }
  });
  return {ps, pq};
}

template <bool Q4>
std::vector<torch::Tensor> unpack(const torch::Tensor& ps, const torch::Tensor& pq, int64_t N) {
  const int64_t G = ps.size(1), words = Q4 ? 4 : 8;
  TORCH_CHECK(ps.is_contiguous() && pq.is_contiguous() && ps.size(0) * R >= N && pq.size(2) == words * 64,
              "unpack: not an interleaved ", Q4 ? "q4" : "q8", " matrix of ", N, " rows");
  auto quants = torch::empty({N, G * words * 4}, Q4 ? torch::kUInt8 : torch::kInt8);
  auto scales = torch::empty({N, G, 2}, torch::kFloat32);
  const auto* src = reinterpret_cast<const uint32_t*>(pq.data_ptr<uint8_t>());
  const auto ps32 = ps.to(torch::kFloat32).contiguous();
  const float* sd = ps32.data_ptr<float>();
  auto* dst = static_cast<uint32_t*>(quants.data_ptr());
  float* s = scales.data_ptr<float>();
  const uint32_t bias = Q4 ? 0u : 0x80808080u;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t grp = r / R, l = r % R;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t t = 0; t < words; ++t) dst[(r * G + g) * words + t] = src[((grp * G + g) * words + t) * R + l] ^ bias;
      for (int64_t i = 0; i < 2; ++i) s[(r * G + g) * 2 + i] = sd[((grp * G + g) * 2 + i) * R + l];
    }
  }
  return {scales, quants};
}

}  // namespace

// 16 on a build with AVX-512 VNNI (the interleaved kernels run), else 0.
int64_t vnni_rows() {
#if SPECDECODE_VNNI
  return R;
#else
  return 0;
#endif
}

// x: [M, K] float32, each row quantized to 8 bits per block of 32; W: N interleaved 4-bit rows
// (pack_q4_vnni) -> x W^T [M, N] float32
torch::Tensor linear_q4_vnni(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<true>(x, scales, quants, N);
}

// The same for 8-bit rows (pack_q8_vnni)
torch::Tensor linear_q8_vnni(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<false>(x, scales, quants, N);
}

std::vector<torch::Tensor> pack_q4_vnni(torch::Tensor scales, torch::Tensor quants) { return pack<true>(scales, quants); }
std::vector<torch::Tensor> pack_q8_vnni(torch::Tensor scales, torch::Tensor quants) { return pack<false>(scales, quants); }
std::vector<torch::Tensor> unpack_q4_vnni(torch::Tensor ps, torch::Tensor pq, int64_t N) { return unpack<true>(ps, pq, N); }
std::vector<torch::Tensor> unpack_q8_vnni(torch::Tensor ps, torch::Tensor pq, int64_t N) { return unpack<false>(ps, pq, N); }

// FastLlama's fused CPU kernels (kernels.py builds this): the few-row matmuls (float32 or bfloat16
// weights, float32 activations) and the small ops between them.
//
// Why: a decode step of a 135M model on two cores spends ~20 ms in its 121 matmuls and, in eager
// PyTorch, another 10-20 ms in ~900 tiny ops (norms, rotary, cache writes, attention, SiLU,
// residual adds), each paying dispatch and allocation for a few hundred floats. Here each group
// between two matmuls is one call. Every row is computed on its own, in the same order whatever
// the number of rows n, so a 1-token decode step and a k+1-token verification give the same bits.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

namespace {

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, ": expected a CPU float32 tensor");
  TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
}

void rms_norm_row(const float* x, const float* w, float* out, int64_t H, double eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < H; ++j) ss += x[j] * x[j];
  const float r = 1.f / std::sqrt(ss / H + static_cast<float>(eps));
#pragma omp simd
  for (int64_t j = 0; j < H; ++j) out[j] = w[j] * (x[j] * r);
}

// x: [n, H] -> rms_norm(x) * w [n, H]; with delta [n, H], first x += delta (in place: x is the
// residual stream, owned by the caller).
torch::Tensor add_rms_norm(torch::Tensor x, std::optional<torch::Tensor> delta, torch::Tensor w, double eps) {
  check(x, "x");
  check(w, "w");
  const int64_t n = x.size(0), H = x.size(1);
  TORCH_CHECK(w.numel() == H, "w: expected ", H, " elements");
  float* xp = x.data_ptr<float>();
  if (delta) {
    check(*delta, "delta");
    TORCH_CHECK(delta->sizes() == x.sizes(), "delta: shape differs from x");
    const float* dp = delta->data_ptr<float>();
#pragma omp simd
    for (int64_t i = 0; i < n * H; ++i) xp[i] += dp[i];
  }
  auto out = torch::empty_like(x);
  for (int64_t i = 0; i < n; ++i) rms_norm_row(xp + i * H, w.data_ptr<float>(), out.data_ptr<float>() + i * H, H, eps);
  return out;
}

// gate_up: [n, 2I] (gate | up) -> silu(gate) * up [n, I]
torch::Tensor silu_mul(torch::Tensor gate_up) {
  check(gate_up, "gate_up");
  const int64_t n = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({n, I}, gate_up.options());
  for (int64_t i = 0; i < n; ++i) {
    const float* g = gate_up.data_ptr<float>() + i * 2 * I;
    const float* u = g + I;
    float* o = out.data_ptr<float>() + i * I;
#pragma omp simd
    for (int64_t j = 0; j < I; ++j) o[j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
  }
  return out;
}

// Rotary embedding of one head vector (HF's rotate_half convention).
void rope(const float* x, const float* cos, const float* sin, float* out, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; ++j) {
    out[j] = x[j] * cos[j] - x[j + half] * sin[j];
    out[j + half] = x[j + half] * cos[j + half] + x[j] * sin[j + half];
  }
}

// qkv: [n, (h + 2 kvh) d] projections of n new tokens; k_cache, v_cache: [kvh, cap, d] one layer's
// cache, the new keys (rotated) and values written at slots start..start+n-1; cos, sin: [n, d];
// mask: [n, start+n] bool (query i sees slot j where true) or none (causal). -> [n, h d]
torch::Tensor attention(torch::Tensor qkv, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos,
                        torch::Tensor sin, std::optional<torch::Tensor> mask, int64_t start, int64_t heads,
                        int64_t kv_heads) {
  for (auto& [t, name] : {std::pair{qkv, "qkv"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}, {cos, "cos"}, {sin, "sin"}})
    check(t, name);
  const int64_t n = qkv.size(0), d = k_cache.size(2), cap = k_cache.size(1), end = start + n;
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * d, "qkv: expected (heads + 2 kv_heads) * head_dim columns");
  TORCH_CHECK(end <= cap, "attention: cache too small");
  TORCH_CHECK(cos.size(0) == n && sin.size(0) == n && cos.size(1) == d, "cos/sin: expected [n, head_dim]");
  const bool* mp = nullptr;
  if (mask) {
    TORCH_CHECK(mask->scalar_type() == torch::kBool && mask->is_contiguous() && mask->size(0) == n &&
                    mask->size(1) == end, "mask: expected a contiguous bool [n, start + n] tensor");
    mp = mask->data_ptr<bool>();
  }
  const float *q_all = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int64_t row = qkv.size(1);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < kv_heads; ++g) {
      const float* k = q_all + i * row + (heads + g) * d;
      rope(k, cp + i * d, sp + i * d, kc + (g * cap + start + i) * d, d);
      std::copy(k + kv_heads * d, k + kv_heads * d + d, vc + (g * cap + start + i) * d);
    }
  auto out = torch::empty({n, heads * d}, qkv.options());
  float* op = out.data_ptr<float>();
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  const int64_t group = heads / kv_heads;
  at::parallel_for(0, heads * n, 1, [&](int64_t begin, int64_t stop) {
    std::vector<float> q(d), p(end);
    for (int64_t task = begin; task < stop; ++task) {
      const int64_t hh = task / n, i = task % n, g = hh / group;
      rope(q_all + i * row + hh * d, cp + i * d, sp + i * d, q.data(), d);
      const float* K = kc + g * cap * d;
      const float* V = vc + g * cap * d;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < end; ++j) {
        if (mp ? !mp[i * end + j] : j > start + i) {
          p[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < d; ++c) s += q[c] * K[j * d + c];
        p[j] = s * scale;
        top = std::max(top, p[j]);
      }
      float* o = op + i * heads * d + hh * d;
      std::fill(o, o + d, 0.f);
      float total = 0.f;
      for (int64_t j = 0; j < end; ++j) {
        if (p[j] == -std::numeric_limits<float>::infinity()) continue;
        const float e = std::exp(p[j] - top);
        total += e;
#pragma omp simd
        for (int64_t c = 0; c < d; ++c) o[c] += e * V[j * d + c];
      }
      const float inv = 1.f / total;
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) o[c] *= inv;
    }
  });
  return out;
}

using v8 = float __attribute__((vector_size(32)));

inline float hsum(v8 a, v8 b) {
  v8 s = a + b;
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// 16 lanes: one AVX-512 register (two AVX2 registers elsewhere).
using v16 = float __attribute__((vector_size(64)));
using v16u16 = uint16_t __attribute__((vector_size(32)));
using v16u32 = uint32_t __attribute__((vector_size(64)));

template <typename W>
inline v16 load16(const W* p);
template <>
inline v16 load16<float>(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <>
inline v16 load16<uint16_t>(const uint16_t* p) {  // bf16 -> fp32 by a 16-bit shift, 16 at once
  v16u16 h;
  std::memcpy(&h, p, sizeof h);
  v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  v16 v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

inline float hsum16(v16 a, v16 b) {
  v16 s = a + b;
  v8 lo, hi;
  std::memcpy(&lo, &s, sizeof lo);
  std::memcpy(&hi, reinterpret_cast<const char*>(&s) + sizeof lo, sizeof hi);
  return hsum(lo, hi);
}

// y[m, r] = <w[r], x[m]> for weight row r and MB rows of x from m0, each weight vector loaded
// once for all of them; two 16-lane accumulators per row (k % 32 < 16, >= 16; K a multiple of 32,
// else a last 16 in the first). The sum for one (r, m) is formed the same way in every tile shape,
// so a row of x gets the same bits whether it comes alone (decoding) or with others (verifying).
template <typename W, int MB>
void tile(const W* w, const float* x, float* y, int64_t K, int64_t N, int64_t r, int64_t m0) {
  v16 acc[MB][2] = {};
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const v16 w0 = load16(w + r * K + k), w1 = load16(w + r * K + k + 16);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      acc[m][0] += w0 * load16(x + (m0 + m) * K + k);
      acc[m][1] += w1 * load16(x + (m0 + m) * K + k + 16);
    }
  }
  if (k < K) {  // K % 32 == 16
    const v16 w0 = load16(w + r * K + k);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) acc[m][0] += w0 * load16(x + (m0 + m) * K + k);
  }
  for (int m = 0; m < MB; ++m) y[(m0 + m) * N + r] = hsum16(acc[m][0], acc[m][1]);
}

// Rows of x per pass over a weight row: with AVX-512's 32 vector registers, 8 rows keep their 16
// accumulators in registers; with AVX2's 16, 4 do.
#ifdef __AVX512F__
constexpr int64_t MAX_MB = 8;
#else
constexpr int64_t MAX_MB = 4;
#endif

// Weight rows [r0, r1) against all M rows of x: per weight row, balanced tiles of at most MAX_MB
// rows (9 rows: 5 + 4, not 8 + 1); the row stays in L1 between its tiles.
template <typename W>
void rows(const W* w, const float* x, float* y, int64_t K, int64_t M, int64_t N, int64_t r0, int64_t r1) {
  const int64_t passes = (M + MAX_MB - 1) / MAX_MB;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t p = 0, m0 = 0; p < passes; ++p) {
      const int64_t mb = (M - m0 + (passes - p) - 1) / (passes - p);  // rows left spread over tiles left
      switch (mb) {
        case 1: tile<W, 1>(w, x, y, K, N, r, m0); break;
        case 2: tile<W, 2>(w, x, y, K, N, r, m0); break;
        case 3: tile<W, 3>(w, x, y, K, N, r, m0); break;
        case 4: tile<W, 4>(w, x, y, K, N, r, m0); break;
#ifdef __AVX512F__
        case 5: tile<W, 5>(w, x, y, K, N, r, m0); break;
        case 6: tile<W, 6>(w, x, y, K, N, r, m0); break;
        case 7: tile<W, 7>(w, x, y, K, N, r, m0); break;
        case 8: tile<W, 8>(w, x, y, K, N, r, m0); break;
#endif
      }
      m0 += mb;
    }
}

}  // namespace

// x: [M, K] float32; weight: [N, K] float32 or bfloat16 (K a multiple of 16) -> x W^T [M, N] float32.
// For the few rows of decoding and verification: each weight row is read once for all M rows of x.
torch::Tensor linear(torch::Tensor x, torch::Tensor weight) {
  check(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.dim() == 2, "weight: expected a contiguous 2-D tensor");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && K % 16 == 0, "linear: weight must be [N, K] with K = x.size(1), a multiple of 16");
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const bool bf16 = weight.scalar_type() == torch::kBFloat16;
  TORCH_CHECK(bf16 || weight.scalar_type() == torch::kFloat32, "weight: expected float32 or bfloat16");
  const void* wp = weight.data_ptr();
  at::parallel_for(0, N, 128, [&](int64_t r0, int64_t r1) {
    if (bf16)
      rows(static_cast<const uint16_t*>(wp), xp, yp, K, M, N, r0, r1);
    else
      rows(static_cast<const float*>(wp), xp, yp, K, M, N, r0, r1);
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_rms_norm", &add_rms_norm, "x += delta (if given); return rms_norm(x) * w", py::arg("x"),
        py::arg("delta"), py::arg("w"), py::arg("eps"));
  m.def("silu_mul", &silu_mul, "silu(gate) * up of [n, 2I] -> [n, I]");
  m.def("linear", &linear, "x W^T for a few rows of x, W float32 or bfloat16");
  m.def("attention", &attention, "rotary + KV-cache write + attention for n new tokens");
}

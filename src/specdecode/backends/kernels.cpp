// FastLlama's fused CPU kernels (kernels.py builds this): the few-row matmuls (float32 or bfloat16
// weights, float32 activations) and the small ops between them.
//
// Why: in eager PyTorch a small model's decode step spends as long in its ~900 tiny ops (norms,
// rotary, cache writes, attention, SiLU, residual adds) as in its matmuls, each op paying dispatch
// and allocation for a few hundred floats (measured: docs/benchmarks.md). Here each group
// between two matmuls is one call. Every row is computed on its own, in the same order whatever
// the number of rows n, so a 1-token decode step and a k+1-token verification give the same bits.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include "tiles.h"
#include "rowops.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

namespace {

void check(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, ": expected a CPU float32 tensor");
  TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
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
    rowops::add_row(xp, delta->data_ptr<float>(), n * H);
  }
  auto out = torch::empty_like(x);
  for (int64_t i = 0; i < n; ++i) rowops::rms_norm_row(xp + i * H, w.data_ptr<float>(), out.data_ptr<float>() + i * H, H, eps);
  return out;
}

// gate_up: [n, 2I] (gate | up) -> silu(gate) * up [n, I]
torch::Tensor silu_mul(torch::Tensor gate_up) {
  check(gate_up, "gate_up");
  const int64_t n = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({n, I}, gate_up.options());
  for (int64_t i = 0; i < n; ++i) {
    const float* g = gate_up.data_ptr<float>() + i * 2 * I;
    rowops::silu_mul_row(g, g + I, out.data_ptr<float>() + i * I, I);
  }
  return out;
}

// The machine's float vector: 16 lanes (one AVX-512 register) or 8 (one AVX2 register; GCC lowers
// wider generic vectors on AVX2 through memory). A block of 32 weights is NV vectors.
#ifdef __AVX512F__
constexpr int L = 16;
#else
constexpr int L = 8;
#endif
constexpr int NV = 32 / L;
using vec = float __attribute__((vector_size(4 * L)));
using vecu16 = uint16_t __attribute__((vector_size(2 * L)));
using vecu32 = uint32_t __attribute__((vector_size(4 * L)));

inline vec loadv(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vec loadv(const uint16_t* p) {  // bf16 -> fp32 by a 16-bit shift, L at once
  vecu16 h;
  std::memcpy(&h, p, sizeof h);
  vecu32 w = __builtin_convertvector(h, vecu32) << 16;
  vec v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}

// The sum of two accumulators' lanes, in a fixed order.
inline float hsum(vec a, vec b) {
  vec s = a + b;
  float t[L];
  std::memcpy(t, &s, sizeof t);
  for (int w = L / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] += t[i + w];
  return t[0];
}

// Where the weights come from: each source gives weight row r's 32 weights at k..k+31 as NV
// vectors (`get`), or the 16 at k (`get16`: a last half block of a dense row, 16 / L vectors).
template <typename W>
struct Dense {  // float32 or bfloat16 [N, K]
  const W* w;
  int64_t K;
  void get(int64_t r, int64_t k, vec* out) const {
    for (int v = 0; v < NV; ++v) out[v] = loadv(w + r * K + k + v * L);
  }
  void get16(int64_t r, int64_t k, vec* out) const {
    for (int v = 0; v < 16 / L; ++v) out[v] = loadv(w + r * K + k + v * L);
  }
};

// 16 bytes in a register: loaded, split into nibbles, widened to float32 (signed or unsigned) as
// q * s + o, into 16 / L vectors. x86 spells it in intrinsics: GCC turns generic byte -> float
// vector conversions into 16 scalar ones.
#if defined(__AVX2__)
using bytes16 = __m128i;
inline bytes16 load_bytes(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline bytes16 low_nibbles(bytes16 b) { return _mm_and_si128(b, _mm_set1_epi8(15)); }
inline bytes16 high_nibbles(bytes16 b) { return _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15)); }
template <bool Signed>
inline void dequant(bytes16 b, float s, float o, vec* out) {
#if defined(__AVX512F__)
  const __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b)),
                                   _mm512_set1_ps(s), _mm512_set1_ps(o));
  std::memcpy(out, &w, sizeof w);
#else
  const __m128i b8 = _mm_srli_si128(b, 8);
  const __m256 sv = _mm256_set1_ps(s), ov = _mm256_set1_ps(o);
  const __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)), sv, ov);
  const __m256 hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(b8) : _mm256_cvtepu8_epi32(b8)), sv, ov);
  std::memcpy(out, &lo, sizeof lo);
  std::memcpy(out + 1, &hi, sizeof hi);
#endif
}
#else
using bytes16 = uint8_t __attribute__((vector_size(16)));
inline bytes16 load_bytes(const void* p) {
  bytes16 b;
  std::memcpy(&b, p, sizeof b);
  return b;
}
inline bytes16 low_nibbles(bytes16 b) { return b & 15; }
inline bytes16 high_nibbles(bytes16 b) { return b >> 4; }
template <bool Signed>
inline void dequant(bytes16 b, float s, float o, vec* out) {
  float w[16];
  for (int i = 0; i < 16; ++i) w[i] = (Signed ? static_cast<float>(static_cast<int8_t>(b[i])) : static_cast<float>(b[i])) * s + o;
  std::memcpy(out, w, sizeof w);
}
#endif

// Quantized rows, G blocks of 32 weights each (GGUF blocks repacked by gguf_weights.py). Dequantized
// in registers to the same float32 values as the reference dequantization: q * s + o is exact for
// these formats (the product needs at most 21 of float32's 24 bits), so fusing it into one FMA
// changes nothing, and the sums below are those of the dequantized model.
struct Q4 {  // per block: s, o (float32) and 16 bytes: weight i in byte i's low nibble, i + 16 in its high
  const float* so;
  const uint8_t* q;
  int64_t G;
  void get(int64_t r, int64_t k, vec* out) const {
    const int64_t g = r * G + k / 32;
    const bytes16 bytes = load_bytes(q + g * 16);
    dequant<false>(low_nibbles(bytes), so[2 * g], so[2 * g + 1], out);
    dequant<false>(high_nibbles(bytes), so[2 * g], so[2 * g + 1], out + NV / 2);
  }
  void get16(int64_t, int64_t, vec*) const {}  // never called: K is a multiple of 32
};

struct Q8 {  // per block: one scale per 16 weights (float32) and 32 signed bytes
  const float* s;
  const int8_t* q;
  int64_t G;
  void get(int64_t r, int64_t k, vec* out) const {
    const int64_t g = r * G + k / 32;
    dequant<true>(load_bytes(q + g * 32), s[2 * g], 0.f, out);  // q * s + 0: the value of q * s
    dequant<true>(load_bytes(q + g * 32 + 16), s[2 * g + 1], 0.f, out + NV / 2);
  }
  void get16(int64_t, int64_t, vec*) const {}
};

// y[m, r] = <w[r], x[m]> for weight row r and MB rows of x from m0, each weight vector loaded (and
// dequantized) once for all of them; two accumulators per row (vector v of a block into v % 2).
// The sum for one (r, m) is formed the same way in every tile shape and for every weight source,
// so a row of x gets the same bits whether it comes alone (decoding) or with others (verifying),
// and quantized weights give the bits of their dequantized float32 copy.
template <typename Src, int MB>
void tile(const Src& w, const float* x, float* y, int64_t K, int64_t N, int64_t r, int64_t m0) {
  vec acc[MB][2] = {};
  vec wv[NV];
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    w.get(r, k, wv);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v % 2] += wv[v] * loadv(x + (m0 + m) * K + k + v * L);
  }
  if (k < K) {  // K % 32 == 16
    w.get16(r, k, wv);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m)
#pragma GCC unroll 4
      for (int v = 0; v < 16 / L; ++v) acc[m][v % 2] += wv[v] * loadv(x + (m0 + m) * K + k + v * L);
  }
  for (int m = 0; m < MB; ++m) y[(m0 + m) * N + r] = hsum(acc[m][0], acc[m][1]);
}

// x [M, K] float32 -> x W^T [M, N]
template <typename Src>
torch::Tensor matmul(const torch::Tensor& x, const Src& w, int64_t N) {
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  for_tiles(M, N, K * 4, [&](auto mb, int64_t r, int64_t m0) { tile<Src, decltype(mb)::value>(w, xp, yp, K, N, r, m0); });
  return y;
}

}  // namespace

// x: [M, K] float32; weight: [N, K] float32 or bfloat16 (K a multiple of 16) -> x W^T [M, N] float32.
// For the few rows of decoding and verification: each weight row is read once for all M rows of x.
torch::Tensor linear(torch::Tensor x, torch::Tensor weight) {
  check(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.dim() == 2, "weight: expected a contiguous 2-D tensor");
  const int64_t K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && K % 16 == 0, "linear: weight must be [N, K] with K = x.size(1), a multiple of 16");
  if (weight.scalar_type() == torch::kBFloat16)
    return matmul(x, Dense<uint16_t>{static_cast<const uint16_t*>(weight.data_ptr()), K}, N);
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32, "weight: expected float32 or bfloat16");
  return matmul(x, Dense<float>{weight.data_ptr<float>(), K}, N);
}

// The quantized weights' shapes: scales [N, G, 2] float32, quants [N, G * bytes] of `type`.
void check_quant(const torch::Tensor& x, const torch::Tensor& scales, const torch::Tensor& quants, int64_t bytes,
                 torch::ScalarType type) {
  check(x, "x");
  check(scales, "scales");
  const int64_t N = quants.size(0), G = x.size(1) / 32;
  TORCH_CHECK(x.size(1) % 32 == 0, "quantized linear: x.size(1) must be a multiple of 32");
  TORCH_CHECK(scales.dim() == 3 && scales.size(0) == N && scales.size(1) == G && scales.size(2) == 2,
              "scales: expected [N, K / 32, 2]");
  TORCH_CHECK(quants.is_contiguous() && quants.dim() == 2 && quants.size(1) == G * bytes && quants.scalar_type() == type,
              "quants: expected a contiguous [N, K / 32 * ", bytes, "] tensor of ", type);
}

// x: [M, K] float32; 4-bit rows (scale and offset per 32 weights) -> x W^T [M, N] float32
torch::Tensor linear_q4(torch::Tensor x, torch::Tensor scales, torch::Tensor quants) {
  check_quant(x, scales, quants, 16, torch::kUInt8);
  return matmul(x, Q4{scales.data_ptr<float>(), quants.data_ptr<uint8_t>(), x.size(1) / 32}, quants.size(0));
}

// x: [M, K] float32; 8-bit rows (a scale per 16 weights) -> x W^T [M, N] float32
torch::Tensor linear_q8(torch::Tensor x, torch::Tensor scales, torch::Tensor quants) {
  check_quant(x, scales, quants, 32, torch::kInt8);
  return matmul(x, Q8{scales.data_ptr<float>(), quants.data_ptr<int8_t>(), x.size(1) / 32}, quants.size(0));
}

namespace {
// Weight rows -> float32 [N, K], the very values the kernels multiply with (Src::get).
template <typename Src>
torch::Tensor dequantize(const Src& w, int64_t N, int64_t K) {
  auto out = torch::empty({N, K}, torch::kFloat32);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t r0, int64_t r1) {
    vec v[NV];
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; k += 32) {
        w.get(r, k, v);
        std::memcpy(o + r * K + k, v, sizeof v);
      }
  });
  return out;
}
}  // namespace

// 4-bit rows (scales [N, G, 2], quants [N, G * 16]) -> float32 [N, G * 32]: for many-row products,
// which go to a dense GEMM
torch::Tensor dequantize_q4(torch::Tensor scales, torch::Tensor quants) {
  const int64_t G = scales.size(1);
  check_quant(torch::empty({0, G * 32}), scales, quants, 16, torch::kUInt8);
  return dequantize(Q4{scales.data_ptr<float>(), quants.data_ptr<uint8_t>(), G}, quants.size(0), G * 32);
}

// 8-bit rows (scales [N, G, 2], quants [N, G * 32]) -> float32 [N, G * 32]
torch::Tensor dequantize_q8(torch::Tensor scales, torch::Tensor quants) {
  const int64_t G = scales.size(1);
  check_quant(torch::empty({0, G * 32}), scales, quants, 32, torch::kInt8);
  return dequantize(Q8{scales.data_ptr<float>(), quants.data_ptr<int8_t>(), G}, quants.size(0), G * 32);
}

torch::Tensor attention(torch::Tensor qkv, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos,
                        torch::Tensor sin, std::optional<torch::Tensor> mask, torch::Tensor slots,
                        torch::Tensor starts, torch::Tensor counts, torch::Tensor table, int64_t heads,
                        int64_t kv_heads, double qk_scale);  // attention.cpp
std::string tile_isa();  // kernels_tile.cpp
std::string tile_prefetch();  // kernels_tile.cpp
torch::Tensor linear_q4_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
torch::Tensor linear_q8_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
torch::Tensor linear_q8_0_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
torch::Tensor linear_q6_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
torch::Tensor linear_q6_0_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
torch::Tensor linear_q5_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
torch::Tensor linear_q5_0_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N);
std::vector<torch::Tensor> pack_q4_tile(torch::Tensor scales, torch::Tensor quants);
std::vector<torch::Tensor> pack_q8_tile(torch::Tensor scales, torch::Tensor quants);
std::vector<torch::Tensor> unpack_q4_tile(torch::Tensor ps, torch::Tensor pq, int64_t N);
std::vector<torch::Tensor> unpack_q8_tile(torch::Tensor ps, torch::Tensor pq, int64_t N);
void bind_stack(pybind11::module& m);  // stack.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the compute calls let other Python threads run (the server's event loop sends chunks meanwhile)
  const auto release = py::call_guard<py::gil_scoped_release>();
  m.def("add_rms_norm", &add_rms_norm, release, "x += delta (if given); return rms_norm(x) * w", py::arg("x"),
        py::arg("delta"), py::arg("w"), py::arg("eps"));
  m.def("silu_mul", &silu_mul, release, "silu(gate) * up of [n, 2I] -> [n, I]");
  m.def("linear", &linear, release, "x W^T for a few rows of x, W float32 or bfloat16");
  m.def("linear_q4", &linear_q4, release, "x W^T, W 4-bit with a float32 scale and offset per 32 weights");
  m.def("linear_q8", &linear_q8, release, "x W^T, W 8-bit with a float32 scale per 16 weights");
  m.def("dequantize_q4", &dequantize_q4, "4-bit rows -> float32 [N, K], the kernels' values");
  m.def("dequantize_q8", &dequantize_q8, "8-bit rows -> float32 [N, K], the kernels' values");
  m.def("tile_isa", &tile_isa, "the ISA of this build's tile microkernel: avx512vnni, avxvnni, avx2, i8mm, neon or scalar");
  m.def("tile_prefetch", &tile_prefetch, "the cache the tile microkernel asks weights ahead into: l1, l2, or none (the portable kernel)");
  m.def("linear_q4_tile", &linear_q4_tile, release, "x W^T, W 4-bit interleaved 16 rows at a time, x in 8 bits",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("linear_q8_tile", &linear_q8_tile, release, "x W^T, W 8-bit interleaved 16 rows at a time, x in 8 bits",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("linear_q8_0_tile", &linear_q8_0_tile, release,
        "linear_q8_tile for rows with one scale per block of 32 (Q8_0): scales [groups, K / 32, 1, 16]",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("linear_q6_tile", &linear_q6_tile, release,
        "linear_q8_tile for rows whose weights lie in -32..31, kept in 6 bits: quants [groups, K / 32, 384]",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("linear_q6_0_tile", &linear_q6_0_tile, release, "linear_q6_tile with one scale per block of 32",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("linear_q5_tile", &linear_q5_tile, release,
        "linear_q8_tile for rows whose weights lie in -16..15, kept in 5 bits: quants [groups, K / 32, 320]",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("linear_q5_0_tile", &linear_q5_0_tile, release, "linear_q5_tile with one scale per block of 32",
        py::arg("x"), py::arg("scales"), py::arg("quants"), py::arg("N"));
  m.def("pack_q4_tile", &pack_q4_tile, "4-bit rows -> (scales, quants) interleaved for linear_q4_tile");
  m.def("pack_q8_tile", &pack_q8_tile, "8-bit rows -> (scales, quants) interleaved for linear_q8_tile");
  m.def("unpack_q4_tile", &unpack_q4_tile, "pack_q4_tile's inverse");
  m.def("unpack_q8_tile", &unpack_q8_tile, "pack_q8_tile's inverse");
  bind_stack(m);
  m.def("attention", &attention, release, "rotary + KV-cache writes + attention for the rows of any sequences");
}

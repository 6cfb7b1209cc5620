// Attention for the rows of one forward (kernels.py builds this with kernels.cpp): rotary, the new
// keys and values written into each sequence's cache slot, and each query row against its own
// sequence's cache, for any mix of sequences (the batched server) and any mask (chains, trees).
//
// Why: the per-row cost of attention is what verification pays k times. The first version (a dot
// product per key with a reduction, a scalar exp per key) took ~1.6 ms per row at a 200-token
// context on one Zen 4 core, as much as a fifth of a decode step per extra row. Here the score,
// exponential and value passes are vector loops over the key axis (exp by a Cephes polynomial,
// within 2 ulp), the query pre-scaled once.
// Invariant: a (row, head) is computed by one task in a fixed order whatever the other rows, so a
// verification row, a decoding step and a request in a batch give the same bits.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "vecmath.h"

namespace {

using namespace vecmath;

// Rotary embedding of one head vector (HF's rotate_half convention), times `scale`.
void rope(const float* x, const float* cos, const float* sin, float* out, int64_t d, float scale = 1.f) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; ++j) {
    out[j] = (x[j] * cos[j] - x[j + half] * sin[j]) * scale;
    out[j + half] = (x[j + half] * cos[j + half] + x[j] * sin[j + half]) * scale;
  }
}

inline float dot(const float* q, const float* k, int64_t d) {
  float s = 0.f;
  for (int64_t c = 0; c < d; ++c) s += q[c] * k[c];
  return s;
}

// One query's scores: p[j] = q . K[j] for the visible keys (else -inf) -> the largest.
// NV > 0: d = NV * L, the query held in registers.
template <int NV>
float scores(const float* q, const float* K, int64_t d, int64_t end, const bool* seen, float* p) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float top = ninf;
  vec qv[NV > 0 ? NV : 1];
  for (int v = 0; v < NV; ++v) qv[v] = load(q + v * L);
  for (int64_t j = 0; j < end; ++j) {
    if (seen && !seen[j]) {
      p[j] = ninf;
      continue;
    }
    float s;
    if constexpr (NV > 0) {
      vec acc = qv[0] * load(K + j * d);
      for (int v = 1; v < NV; ++v) acc += qv[v] * load(K + j * d + v * L);
      s = reduce(acc);
    } else {
      s = dot(q, K + j * d, d);
    }
    p[j] = s;
    top = std::max(top, s);
  }
  return top;
}

// out [d] = sum_j p[j] V[j] / sum_j p[j]
template <int NV>
void weighted_values(const float* p, const float* V, int64_t d, int64_t end, float sum, float* out) {
  const float inv = 1.f / sum;
  if constexpr (NV > 0) {
    vec acc[NV] = {};
    for (int64_t j = 0; j < end; ++j) {
      if (p[j] == 0.f) continue;
      const vec w = splat(p[j]);
      for (int v = 0; v < NV; ++v) acc[v] += w * load(V + j * d + v * L);
    }
    for (int v = 0; v < NV; ++v) store(out + v * L, acc[v] * inv);
  } else {
    std::fill(out, out + d, 0.f);
    for (int64_t j = 0; j < end; ++j)
      for (int64_t c = 0; c < d; ++c) out[c] += p[j] * V[j * d + c];
    for (int64_t c = 0; c < d; ++c) out[c] *= inv;
  }
}

// p[j] = exp(p[j] - top) -> their sum, added key by key in order: a tree node sees its ancestors at
// other cache slots than a decoding step sees the same tokens, so the sum must not depend on where a
// key sits (hidden keys add exact zeros; the visible ones come in the same order either way).
float exponentiate(float* p, int64_t end, float top) {
  std::fill(p + end, p + (end + L - 1) / L * L, -std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < end; j += L) store(p + j, vexp(load(p + j) - top));
  float sum = 0.f;
  for (int64_t j = 0; j < end; ++j) sum += p[j];
  return sum;
}

// q [d] against keys 0..end-1 (visible where `seen`) of one head's K [cap, d], V: -> out [d]
template <int NV>
void one_query(const float* q, const float* K, const float* V, int64_t d, int64_t end, const bool* seen,
               float* p, float* out) {
  const float top = scores<NV>(q, K, d, end, seen, p);
  weighted_values<NV>(p, V, d, end, exponentiate(p, end, top), out);
}

using query_fn = void (*)(const float*, const float*, const float*, int64_t, int64_t, const bool*, float*, float*);

query_fn for_width(int64_t d) {  // the query kept in registers for the common head widths
  switch (d) {
    case 4 * L: return one_query<4>;
    case 8 * L: return one_query<8>;
    case 16 * L: return one_query<16>;
    default: return one_query<0>;
  }
}

void check(const torch::Tensor& t, const char* name, torch::ScalarType type = torch::kFloat32) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), name,
              ": expected a contiguous CPU tensor of ", type);
}

}  // namespace

// qkv: [N, (h + 2 kvh) d] projections of N new tokens, the rows of sequence b at offsets
// sum(counts[:b]).. ; k_cache, v_cache: [S, kvh, cap, d] one layer's caches of S slots: sequence b's
// new keys (rotated) and values are written into slot slots[b] at positions starts[b]..+counts[b]-1;
// cos, sin: [N, d] each row's rotary position; mask: [N, L] bool, L >= every starts[b] + counts[b]
// (row i of sequence b sees key j < starts[b] + counts[b] of its slot where mask[i, j]), or none:
// causal (row t of sequence b sees keys 0..starts[b] + t); scale: of q.k (1 / sqrt(d) when <= 0).
// -> [N, h d]
torch::Tensor attention(torch::Tensor qkv, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos,
                        torch::Tensor sin, std::optional<torch::Tensor> mask, torch::Tensor slots,
                        torch::Tensor starts, torch::Tensor counts, int64_t heads, int64_t kv_heads, double qk_scale) {
  for (auto& [t, name] : {std::pair{qkv, "qkv"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}, {cos, "cos"}, {sin, "sin"}})
    check(t, name);
  for (auto& [t, name] : {std::pair{slots, "slots"}, {starts, "starts"}, {counts, "counts"}}) check(t, name, torch::kLong);
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "k_cache, v_cache: expected [slots, kv_heads, cap, d]");
  const int64_t N = qkv.size(0), S = k_cache.size(0), cap = k_cache.size(2), d = k_cache.size(3), B = slots.numel();
  TORCH_CHECK(k_cache.size(1) == kv_heads && heads % kv_heads == 0, "k_cache: expected ", kv_heads, " kv heads");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * d, "qkv: expected (heads + 2 kv_heads) * head_dim columns");
  TORCH_CHECK(cos.size(0) == N && sin.size(0) == N && cos.size(1) == d && sin.size(1) == d, "cos/sin: expected [N, head_dim]");
  TORCH_CHECK(starts.numel() == B && counts.numel() == B, "slots, starts, counts: one entry per sequence");
  const int64_t *sl = slots.data_ptr<int64_t>(), *st = starts.data_ptr<int64_t>(), *ct = counts.data_ptr<int64_t>();
  std::vector<int64_t> seq_of(N), first(B);
  int64_t rows = 0, longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(sl[b] >= 0 && sl[b] < S && st[b] >= 0 && ct[b] >= 0 && st[b] + ct[b] <= cap,
                "attention: sequence ", b, " (slot ", sl[b], ", positions ", st[b], "..", st[b] + ct[b], ") outside the cache");
    first[b] = rows;
    for (int64_t t = 0; t < ct[b]; ++t) seq_of[rows + t] = b;
    rows += ct[b];
    longest = std::max(longest, st[b] + ct[b]);
  }
  TORCH_CHECK(rows == N, "counts: expected ", N, " rows in all, got ", rows);
  const bool* mp = nullptr;
  int64_t mask_cols = 0;
  if (mask) {
    TORCH_CHECK(mask->scalar_type() == torch::kBool && mask->is_contiguous() && mask->dim() == 2 && mask->size(0) == N &&
                    mask->size(1) >= longest, "mask: expected a contiguous bool [N, >= start + count] tensor");
    mp = mask->data_ptr<bool>();
    mask_cols = mask->size(1);
  }
  const float *q_all = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const int64_t row = qkv.size(1);
  auto cache_row = [&](int64_t i, int64_t g) {  // offset of row i's key/value of kv head g
    const int64_t b = seq_of[i];
    return ((sl[b] * kv_heads + g) * cap + st[b] + i - first[b]) * d;
  };
  for (int64_t i = 0; i < N; ++i)
    for (int64_t g = 0; g < kv_heads; ++g) {
      const float* k = q_all + i * row + (heads + g) * d;
      rope(k, cp + i * d, sp + i * d, kc + cache_row(i, g), d);
      std::copy(k + kv_heads * d, k + kv_heads * d + d, vc + cache_row(i, g));
    }
  auto out = torch::empty({N, heads * d}, qkv.options());
  float* op = out.data_ptr<float>();
  const float scale = qk_scale > 0 ? static_cast<float>(qk_scale) : 1.f / std::sqrt(static_cast<float>(d));
  const int64_t group = heads / kv_heads;
  const query_fn query = for_width(d);
  at::parallel_for(0, heads * N, 1, [&](int64_t begin, int64_t stop) {
    std::vector<float> q(d), p(longest + L);
    for (int64_t task = begin; task < stop; ++task) {
      const int64_t hh = task / N, i = task % N, g = hh / group, b = seq_of[i];
      rope(q_all + i * row + hh * d, cp + i * d, sp + i * d, q.data(), d, scale);
      const int64_t base = (sl[b] * kv_heads + g) * cap * d;
      const int64_t end = mp ? st[b] + ct[b] : st[b] + i - first[b] + 1;
      query(q.data(), kc + base, vc + base, d, end, mp ? mp + i * mask_cols : nullptr, p.data(),
            op + (i * heads + hh) * d);
    }
  });
  return out;
}

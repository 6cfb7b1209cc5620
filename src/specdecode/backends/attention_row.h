// One attention row (attention.cpp's pieces, described there), shared by attention.cpp's per-layer
// call and stack.cpp's whole forward, so both give a (row, head) the same bits: rotary, the cache
// writes of new rows, and one query against its sequence's keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "vecmath.h"

namespace attn {

using namespace vecmath;

// Rotary embedding of one head vector (HF's rotate_half convention), times `scale`.
inline void rope(const float* x, const float* cos, const float* sin, float* out, int64_t d, float scale = 1.f) {
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
inline float exponentiate(float* p, int64_t end, float top) {
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

inline query_fn for_width(int64_t d) {  // the query kept in registers for the common head widths
  switch (d) {
    case 4 * L: return one_query<4>;
    case 8 * L: return one_query<8>;
    case 16 * L: return one_query<16>;
    default: return one_query<0>;
  }
}

// Where a forward's rows sit: sequence b's counts[b] rows come next in the rows, at cache positions
// starts[b].. of slot slots[b]; qkv rows [N, (h + 2 kvh) d]; caches [S, kvh, cap, d] of one layer.
struct Layout {
  const int64_t *slots, *starts, *counts;
  std::vector<int64_t> seq_of, first;
  int64_t rows = 0, longest = 0;  // rows in all; the largest start + count

  Layout(const int64_t* sl, const int64_t* st, const int64_t* ct, int64_t B) : slots(sl), starts(st), counts(ct), first(B) {
    for (int64_t b = 0; b < B; ++b) {
      first[b] = rows;
      for (int64_t t = 0; t < ct[b]; ++t) seq_of.push_back(b);
      rows += ct[b];
      longest = std::max(longest, st[b] + ct[b]);
    }
  }
};

// One layer's attention for a forward's rows: heads h, kv heads kvh, width d, cache capacity cap;
// mask [N, mask_cols] bool or null (causal); scale of q.k.
struct Step {
  const Layout& lay;
  const float *qkv, *cos, *sin;
  float *k_cache, *v_cache, *out;
  const bool* mask;
  int64_t mask_cols, heads, kv_heads, d, cap;
  float scale;

  int64_t cache_row(int64_t i, int64_t g) const {  // offset of row i's key/value of kv head g
    const int64_t b = lay.seq_of[i];
    return ((lay.slots[b] * kv_heads + g) * cap + lay.starts[b] + i - lay.first[b]) * d;
  }
  // task i * kv_heads + g: row i's key (rotated) and value of kv head g into the caches
  void write(int64_t task) const {
    const int64_t i = task / kv_heads, g = task % kv_heads, row = (heads + 2 * kv_heads) * d;
    const float* k = qkv + i * row + (heads + g) * d;
    rope(k, cos + i * d, sin + i * d, k_cache + cache_row(i, g), d);
    std::copy(k + kv_heads * d, k + kv_heads * d + d, v_cache + cache_row(i, g));
  }
  // task hh * N + i: row i's head hh against its sequence's keys -> out [N, h d]; q [d] and
  // p [longest + L] scratch
  void query(int64_t task, query_fn fn, float* q, float* p) const {
    const int64_t N = lay.rows, hh = task / N, i = task % N, g = hh / (heads / kv_heads), b = lay.seq_of[i];
    const int64_t row = (heads + 2 * kv_heads) * d;
    rope(qkv + i * row + hh * d, cos + i * d, sin + i * d, q, d, scale);
    const int64_t base = (lay.slots[b] * kv_heads + g) * cap * d;
    const int64_t end = mask ? lay.starts[b] + lay.counts[b] : lay.starts[b] + i - lay.first[b] + 1;
    fn(q, k_cache + base, v_cache + base, d, end, mask ? mask + i * mask_cols : nullptr, p, out + (i * heads + hh) * d);
  }
};

}  // namespace attn

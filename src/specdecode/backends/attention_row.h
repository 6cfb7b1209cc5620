// Attention's pieces (attention.cpp describes them), shared by attention.cpp's per-layer call and
// stack.cpp's whole forward, so both give a (row, head) the same bits: rotary, the cache writes of new
// rows, and groups of queries against their sequence's keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
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

// v, kept in a register (PIN): left alone, the compiler folds a loaded key or value row into each
// query's multiply-adds as a memory operand and loads it once per query again (a group of 3 queries:
// 4.6 ns a key a query instead of 3.5). Pinned only while the group's vectors leave room: with 6
// queries of 4 vectors the compiler keeps the rows in registers itself, and a pin costs spills.
template <bool PIN>
inline vec in_register(vec v) {
#if (defined(__AVX2__) || defined(__AVX512F__)) && !defined(SPECDECODE_EMULATED_ISA)  // (tests' emulation)
  if constexpr (PIN) asm("" : "+v"(v));
#endif
  return v;
}

// A KV cache's element: float, float16 bits (uint16_t: widened exactly as they are loaded), or int8
// rows (int8_t: a row of d is d signed bytes, then d / 32 float scales, one a group of 32: value c is
// q[c] * scale[c / 32], scale = max |x| / 127 over the group, q = x / scale rounded to nearest even;
// llama.cpp's q8_0 numbers, kept per cache row so that a row is written and read on its own).
enum class Cache { F32, F16, Q8 };
constexpr int64_t Q8_GROUP = 32;

// elements of T a cache row of width d takes
template <typename T>
constexpr int64_t row_len(int64_t d) {
  return std::is_same_v<T, int8_t> ? d + d / Q8_GROUP * 4 : d;
}
inline float q8_scale(const int8_t* row, int64_t d, int64_t c) {
  float s;
  std::memcpy(&s, row + d + c / Q8_GROUP * 4, 4);
  return s;
}
// vector v (elements v L..) of a cache row, as floats
template <typename T>
inline vec load_row(const T* row, int v, int64_t d) {
  if constexpr (std::is_same_v<T, int8_t>)
    return load(row + v * L) * splat(q8_scale(row, d, v * L));
  else
    return load(row + v * L);
}
// element c of a cache row, as a float
template <typename T>
inline float row_at(const T* row, int64_t c, int64_t d) {
  if constexpr (std::is_same_v<T, float>)
    return row[c];
  else if constexpr (std::is_same_v<T, uint16_t>)
    return half::to_float(row[c]);
  else
    return static_cast<float>(row[c]) * q8_scale(row, d, c);
}
// x [d] as an int8 cache row (Cache::Q8); d a multiple of Q8_GROUP
inline void q8_row(const float* x, int8_t* row, int64_t d) {
  for (int64_t c0 = 0; c0 < d; c0 += Q8_GROUP) {
    float top = 0.f;
    for (int64_t c = c0; c < c0 + Q8_GROUP; ++c) top = std::max(top, std::fabs(x[c]));
    const float scale = top / 127.f;
    for (int64_t c = c0; c < c0 + Q8_GROUP; ++c)
      row[c] = static_cast<int8_t>(scale > 0.f ? std::nearbyint(x[c] / scale) : 0.f);
    std::memcpy(row + d + c0 / Q8_GROUP * 4, &scale, 4);
  }
}

// One kv head's keys and values in a sequence's cache blocks: key j's row is
// k + blocks[j / block] * block_stride + (j % block) * row_len<T>(d) (v the same), a block holding
// `block` consecutive positions of every kv head ([blocks, kv_heads, block, row_len]; a contiguous
// cache is one block).
template <typename T>
struct Keys {
  const T *k, *v;
  const int64_t* blocks;
  int64_t block_stride, block;
};

// Up to G queries that read the same keys (the heads of one kv head, the rows of one sequence):
// q [G, d] (rotated and scaled) against keys j < ends[g] of one head's keys and values, key j visible
// to query g where seen[g] is null or seen[g][j] -> out[g] [d]; p: scratch [G, stride], stride >= the
// largest end + L. d = NV * L: each key and value row is loaded into registers once for all G queries
// (the loads, not the arithmetic, bounded the one-query loop). Query g's bits do not depend on the
// others: a hidden or later key scores -inf, weighs an exact 0 and adds 0 to its sum.
template <int NV, int G, typename T>
void queries(const float* q, const Keys<T>& kv, const int64_t* ends, const bool* const* seen, float* p,
             int64_t stride, float* const* out) {
  constexpr int64_t d = NV * L, R = row_len<T>(d);
  const float ninf = -std::numeric_limits<float>::infinity();
  int64_t end = 0;
  for (int g = 0; g < G; ++g) end = std::max(end, ends[g]);
  vec qv[G][NV];
  float top[G];
  for (int g = 0; g < G; ++g) {
    for (int v = 0; v < NV; ++v) qv[g][v] = load(q + g * d + v * L);
    top[g] = ninf;
  }
  for (int64_t j0 = 0; j0 < end; j0 += kv.block) {  // scores: p[g, j] = q_g . K[j], a block at a time
    const T* K = kv.k + kv.blocks[j0 / kv.block] * kv.block_stride;
    for (int64_t j = j0; j < std::min(end, j0 + kv.block); ++j) {
      vec k[NV];
      for (int v = 0; v < NV; ++v) k[v] = in_register<G * NV <= 16>(load_row(K + (j - j0) * R, v, d));
      for (int g = 0; g < G; ++g) {
        vec acc = fma(qv[g][0], k[0], vec{});
        for (int v = 1; v < NV; ++v) acc = fma(qv[g][v], k[v], acc);
        const bool shown = j < ends[g] && (!seen[g] || seen[g][j]);
        const float s = shown ? reduce(acc) : ninf;
        p[g * stride + j] = s;
        top[g] = std::max(top[g], s);
      }
    }
  }
  for (int g = 0; g < G; ++g) {  // p = exp(p - top), -inf past the end up to a whole vector
    float* pg = p + g * stride;
    std::fill(pg + end, pg + (end + L - 1) / L * L, ninf);
    for (int64_t j = 0; j < end; j += L) store(pg + j, vexp(load(pg + j) - top[g]));
  }
  vec acc[G][NV] = {};
  float sum[G] = {};  // added key by key in order: the same bits wherever a tree puts its keys
  for (int64_t j0 = 0; j0 < end; j0 += kv.block) {
    const T* V = kv.v + kv.blocks[j0 / kv.block] * kv.block_stride;
    for (int64_t j = j0; j < std::min(end, j0 + kv.block); ++j) {
      vec vr[NV];
      for (int v = 0; v < NV; ++v) vr[v] = in_register<G * NV <= 16>(load_row(V + (j - j0) * R, v, d));
      for (int g = 0; g < G; ++g) {
        const float w = p[g * stride + j];
        sum[g] += w;
        for (int v = 0; v < NV; ++v) acc[g][v] = fma(splat(w), vr[v], acc[g][v]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int v = 0; v < NV; ++v) store(out[g] + v * L, acc[g][v] * (1.f / sum[g]));
}

// One query of any width d (no register blocking): the same passes, scalar.
template <typename T>
void query_any(const float* q, const Keys<T>& kv, int64_t d, int64_t end, const bool* seen, float* p, float* out) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t R = row_len<T>(d);
  auto row = [&](const T* base, int64_t j) { return base + kv.blocks[j / kv.block] * kv.block_stride + j % kv.block * R; };
  float top = ninf;
  for (int64_t j = 0; j < end; ++j) {
    const T* K = row(kv.k, j);
    float s = 0.f;
    for (int64_t c = 0; c < d; ++c) s = std::fma(q[c], row_at(K, c, d), s);
    p[j] = seen && !seen[j] ? ninf : s;
    top = std::max(top, p[j]);
  }
  float sum = 0.f;
  std::fill(out, out + d, 0.f);
  for (int64_t j = 0; j < end; ++j) {
    p[j] = p[j] == ninf ? 0.f : std::exp(p[j] - top);
    sum += p[j];
    const T* V = row(kv.v, j);
    for (int64_t c = 0; c < d; ++c) out[c] = std::fma(p[j], row_at(V, c, d), out[c]);
  }
  for (int64_t c = 0; c < d; ++c) out[c] *= 1.f / sum;
}

constexpr int MAX_GROUP = 6;  // queries a group task holds at most (for_group's kernels, Step::group's arrays)

// The most queries a group holds for head width d: its queries' and one key's vectors in registers.
inline int group_limit(int64_t d) {
  const int64_t nv = d % L == 0 ? d / L : 0, registers = L == 16 ? 32 : 16;
  if (nv != 4 && nv != 8 && nv != 16) return 1;
  return static_cast<int>(std::clamp<int64_t>((registers - 2 - nv) / nv, 1, MAX_GROUP));
}

template <typename T>
using group_fn = void (*)(const float*, const Keys<T>&, const int64_t*, const bool* const*, float*, int64_t,
                          float* const*);

// The kernel for G <= group_limit(d) queries of width d, or null where query_any serves.
template <typename T>
group_fn<T> for_group(int64_t d, int G) {
  static constexpr group_fn<T> four[MAX_GROUP] = {queries<4, 1, T>, queries<4, 2, T>, queries<4, 3, T>,
                                                   queries<4, 4, T>, queries<4, 5, T>, queries<4, 6, T>};
  if (d == 4 * L) return four[std::clamp(G, 1, MAX_GROUP) - 1];
  if (d == 8 * L) return G >= 2 ? queries<8, 2, T> : queries<8, 1, T>;
  if (d == 16 * L) return queries<16, 1, T>;
  return nullptr;
}

// Where a forward's rows sit: sequence b's counts[b] rows come next in the rows, at cache positions
// starts[b].. of slot slots[b]; qkv rows [N, (h + 2 kvh) d]; a layer's cache [blocks, kvh, block, d],
// position t of slot s in block table[s * per_slot + t / block] (paged; a contiguous cache of one
// slot is one block of its capacity, table [0]).
struct Layout {
  const int64_t *slots, *starts, *counts, *table;
  int64_t per_slot, block;
  std::vector<int64_t> seq_of, first;
  int64_t rows = 0, longest = 0;  // rows in all; the largest start + count

  Layout(const int64_t* sl, const int64_t* st, const int64_t* ct, int64_t B, const int64_t* tb, int64_t per, int64_t blk)
      : slots(sl), starts(st), counts(ct), table(tb), per_slot(per), block(blk), first(B) {
    for (int64_t b = 0; b < B; ++b) {
      first[b] = rows;
      for (int64_t t = 0; t < ct[b]; ++t) seq_of.push_back(b);
      rows += ct[b];
      longest = std::max(longest, st[b] + ct[b]);
    }
  }
};

// A task of a layer's attention: heads h0..h0+nh-1 (of one kv head) of rows r0..r0+nr-1 (of one
// sequence), queries that read the same keys; the same tasks serve every layer of a forward.
struct Group {
  int64_t r0, nr, h0, nh;
};

// The forward's groups, each of at most `limit` queries: as many heads of a kv head as divide its
// share and fit, then as many rows as fit beside them.
inline std::vector<Group> groups(const Layout& lay, int64_t heads, int64_t kv_heads, int limit) {
  const int64_t per = heads / kv_heads;
  int64_t nh = std::min<int64_t>(per, limit);
  while (per % nh) --nh;
  const int64_t nr = std::max<int64_t>(1, limit / nh);
  std::vector<Group> out;
  for (size_t b = 0; b < lay.first.size(); ++b)
    for (int64_t h0 = 0; h0 < heads; h0 += nh)
      for (int64_t r = lay.first[b]; r < lay.first[b] + lay.counts[b]; r += nr)
        out.push_back({r, std::min(nr, lay.first[b] + lay.counts[b] - r), h0, nh});
  return out;
}

constexpr int64_t MAX_D = 512;  // the widest head a float16 cache's rows are rotated for (write)

// One layer's attention for a forward's rows: heads h, kv heads kvh, width d; caches as Layout's, of
// `cache`'s element (Cache); mask [N, mask_cols] bool or null (causal); scale of q.k.
struct Step {
  const Layout& lay;
  const float *qkv, *cos, *sin;
  void *k_cache, *v_cache;
  float* out;
  const bool* mask;
  int64_t mask_cols, heads, kv_heads, d;
  float scale;
  Cache cache;

  // the element offset of row i's key/value of kv head g, rows of R elements
  int64_t cache_row(int64_t i, int64_t g, int64_t R) const {
    const int64_t b = lay.seq_of[i], pos = lay.starts[b] + i - lay.first[b];
    const int64_t block = lay.table[lay.slots[b] * lay.per_slot + pos / lay.block];
    return ((block * kv_heads + g) * lay.block + pos % lay.block) * R;
  }
  // task i * kv_heads + g: row i's key (rotated) and value of kv head g into the caches (a float16
  // cache: rounded to nearest, half.h; an int8 one: q8_row)
  void write(int64_t task) const {
    const int64_t i = task / kv_heads, g = task % kv_heads, row = (heads + 2 * kv_heads) * d;
    const float* k = qkv + i * row + (heads + g) * d;
    if (cache == Cache::F32) {
      const int64_t at = cache_row(i, g, d);
      rope(k, cos + i * d, sin + i * d, static_cast<float*>(k_cache) + at, d);
      std::copy(k + kv_heads * d, k + kv_heads * d + d, static_cast<float*>(v_cache) + at);
      return;
    }
    float rotated[MAX_D];
    rope(k, cos + i * d, sin + i * d, rotated, d);
    if (cache == Cache::Q8) {
      const int64_t at = cache_row(i, g, row_len<int8_t>(d));
      q8_row(rotated, static_cast<int8_t*>(k_cache) + at, d);
      q8_row(k + kv_heads * d, static_cast<int8_t*>(v_cache) + at, d);
      return;
    }
    const int64_t at = cache_row(i, g, d);
    uint16_t *kh = static_cast<uint16_t*>(k_cache) + at, *vh = static_cast<uint16_t*>(v_cache) + at;
    for (int64_t c = 0; c < d; ++c) {
      kh[c] = half::from_float(rotated[c]);
      vh[c] = half::from_float(k[kv_heads * d + c]);
    }
  }
  // heads h0.. of row r0.. of one sequence, at most group_limit(d) queries (Groups) -> their rows of
  // out [N, h d]; q [limit, d] and p [limit, stride] scratch, stride >= longest + L
  void group(const Group& gr, float* q, float* p, int64_t stride) const {
    const int64_t b = lay.seq_of[gr.r0], row = (heads + 2 * kv_heads) * d, g = gr.h0 / (heads / kv_heads);
    int64_t ends[MAX_GROUP];
    const bool* seen[MAX_GROUP];
    float* outs[MAX_GROUP];
    int n = 0;
    for (int64_t i = gr.r0; i < gr.r0 + gr.nr; ++i)
      for (int64_t hh = gr.h0; hh < gr.h0 + gr.nh; ++hh, ++n) {
        rope(qkv + i * row + hh * d, cos + i * d, sin + i * d, q + n * d, d, scale);
        ends[n] = mask ? lay.starts[b] + lay.counts[b] : lay.starts[b] + i - lay.first[b] + 1;
        seen[n] = mask ? mask + i * mask_cols : nullptr;
        outs[n] = out + (i * heads + hh) * d;
      }
    if (cache == Cache::F16)
      read<uint16_t>(g, b, n, q, ends, seen, p, stride, outs);
    else if (cache == Cache::Q8)
      read<int8_t>(g, b, n, q, ends, seen, p, stride, outs);
    else
      read<float>(g, b, n, q, ends, seen, p, stride, outs);
  }

  template <typename T>
  void read(int64_t g, int64_t b, int n, const float* q, const int64_t* ends, const bool* const* seen, float* p,
            int64_t stride, float* const* outs) const {
    const int64_t R = row_len<T>(d), head = g * lay.block * R;
    const Keys<T> kv{static_cast<const T*>(k_cache) + head, static_cast<const T*>(v_cache) + head,
                     lay.table + lay.slots[b] * lay.per_slot, kv_heads * lay.block * R, lay.block};
    if (const group_fn<T> fn = for_group<T>(d, n))
      fn(q, kv, ends, seen, p, stride, outs);
    else
      for (int m = 0; m < n; ++m) query_any(q + m * d, kv, d, ends[m], seen[m], p, outs[m]);
  }
};

}  // namespace attn

// Argument checks shared by attention.cpp and stack.cpp, the two callers that lay a forward's rows
// out over cache slots (attention_row.h's Layout).
#pragma once

#include <torch/extension.h>

#include "attention_row.h"

namespace checks {

inline void tensor(const torch::Tensor& t, const char* name, torch::ScalarType type = torch::kFloat32) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), name,
              ": expected a contiguous CPU tensor of ", type);
}

// A KV cache: a contiguous CPU tensor of float32, float16 or int8 rows (attention_row.h's Cache: its
// last dimension d + d / 8, d a multiple of 32) -> which; keys and values of one precision, heads d
// wide (a float16 or int8 row is rotated in a buffer of attn::MAX_D).
inline attn::Cache caches(const torch::Tensor& k, const torch::Tensor& v, int64_t d) {
  const auto type = k.scalar_type();
  TORCH_CHECK(type == torch::kFloat32 || type == torch::kFloat16 || type == torch::kChar,
              "k_cache: expected float32, float16 or int8, got ", type);
  tensor(k, "k_cache", type);
  tensor(v, "v_cache", type);
  TORCH_CHECK(type == torch::kFloat32 || d <= attn::MAX_D, "a float16 or int8 KV cache takes heads up to ", attn::MAX_D,
              " wide");
  if (type != torch::kChar) return type == torch::kFloat16 ? attn::Cache::F16 : attn::Cache::F32;
  TORCH_CHECK(d % attn::Q8_GROUP == 0, "an int8 KV cache takes heads a multiple of ", attn::Q8_GROUP, " wide, not ", d);
  return attn::Cache::Q8;
}

// the width of a cache tensor's rows for heads d wide
inline int64_t row_width(const torch::Tensor& k, int64_t d) {
  return k.scalar_type() == torch::kChar ? attn::row_len<int8_t>(d) : d;
}

// slots, starts, counts [B] long: sequence b's counts[b] rows at positions starts[b].. of slot slots[b];
// table [S, per_slot] long: slot s's position t in cache block table[s, t / block] of `blocks`; N rows
// in all -> their Layout; an error names a sequence outside its slot's blocks or a wrong row count.
inline attn::Layout layout(const torch::Tensor& slots, const torch::Tensor& starts, const torch::Tensor& counts,
                           const torch::Tensor& table, int64_t blocks, int64_t block, int64_t N) {
  for (auto& [t, name] : {std::pair{&slots, "slots"}, {&starts, "starts"}, {&counts, "counts"}, {&table, "table"}})
    tensor(*t, name, torch::kLong);
  TORCH_CHECK(table.dim() == 2 && block > 0, "table: expected [slots, blocks per slot]");
  const int64_t B = slots.numel(), S = table.size(0), per_slot = table.size(1);
  TORCH_CHECK(starts.numel() == B && counts.numel() == B, "slots, starts, counts: one entry per sequence");
  const int64_t *sl = slots.data_ptr<int64_t>(), *st = starts.data_ptr<int64_t>(), *ct = counts.data_ptr<int64_t>();
  const int64_t* tb = table.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(sl[b] >= 0 && sl[b] < S && st[b] >= 0 && ct[b] >= 0 && st[b] + ct[b] <= per_slot * block, "sequence ",
                b, " (slot ", sl[b], ", positions ", st[b], "..", st[b] + ct[b], ") outside the cache");
    for (int64_t t = 0; t * block < st[b] + ct[b]; ++t)
      TORCH_CHECK(tb[sl[b] * per_slot + t] >= 0 && tb[sl[b] * per_slot + t] < blocks, "table: slot ", sl[b],
                  "'s block ", t, " is ", tb[sl[b] * per_slot + t], ", not one of the cache's ", blocks);
  }
  attn::Layout layout(sl, st, ct, B, tb, per_slot, block);
  TORCH_CHECK(layout.rows == N, "counts: expected ", N, " rows in all, got ", layout.rows);
  return layout;
}

}  // namespace checks

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

// slots, starts, counts [B] long: sequence b's counts[b] rows at positions starts[b].. of slot slots[b]
// of a cache of S slots and cap positions, N rows in all -> their Layout; an error names a sequence
// outside the cache or a wrong row count.
inline attn::Layout layout(const torch::Tensor& slots, const torch::Tensor& starts, const torch::Tensor& counts,
                           int64_t S, int64_t cap, int64_t N) {
  for (auto& [t, name] : {std::pair{&slots, "slots"}, {&starts, "starts"}, {&counts, "counts"}})
    tensor(*t, name, torch::kLong);
  const int64_t B = slots.numel();
  TORCH_CHECK(starts.numel() == B && counts.numel() == B, "slots, starts, counts: one entry per sequence");
  const int64_t *sl = slots.data_ptr<int64_t>(), *st = starts.data_ptr<int64_t>(), *ct = counts.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(sl[b] >= 0 && sl[b] < S && st[b] >= 0 && ct[b] >= 0 && st[b] + ct[b] <= cap, "sequence ", b,
                " (slot ", sl[b], ", positions ", st[b], "..", st[b] + ct[b], ") outside the cache");
  attn::Layout layout(sl, st, ct, B);
  TORCH_CHECK(layout.rows == N, "counts: expected ", N, " rows in all, got ", layout.rows);
  return layout;
}

}  // namespace checks

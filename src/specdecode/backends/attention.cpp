// Attention for the rows of one forward (kernels.py builds this with kernels.cpp): rotary, the new
// keys and values written into each sequence's cache slot, and each query row against its own
// sequence's cache, for any mix of sequences (the batched server) and any mask (chains, trees).
//
// Why: the per-row cost of attention is what verification pays k times. The first version (a dot
// product per key with a reduction, a scalar exp per key) cost as much as a fifth of a decode step
// per extra row (docs/native_forward.md). Here the score,
// exponential and value passes are vector loops over the key axis (exp by a Cephes polynomial,
// within 2 ulp), the query pre-scaled once; and the queries that read the same keys (the heads of a
// kv head, the rows of a sequence: up to 6 of width 64 on AVX-512) are one task that loads each key
// and value row once for all of them, since the loads, not the multiply-adds, bounded a lone query.
// Invariant: a (row, head)'s arithmetic is fixed whatever the other rows and whichever group holds
// it, so a verification row, a decoding step and a request in a batch give the same bits.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "attention_row.h"
#include "checks.h"

// qkv: [N, (h + 2 kvh) d] projections of N new tokens, the rows of sequence b at offsets
// sum(counts[:b]).. ; k_cache, v_cache: [blocks, kvh, block, d] one layer's cache blocks (float32 or
// float16; int8: [blocks, kvh, block, d + d / 8], attention_row.h's Cache), table
// [S, per_slot] long each slot's blocks (attention_row.h's Layout): sequence b's new keys (rotated)
// and values are written into slot slots[b] at positions starts[b]..+counts[b]-1;
// cos, sin: [N, d] each row's rotary position; mask: [N, L] bool, L >= every starts[b] + counts[b]
// (row i of sequence b sees key j < starts[b] + counts[b] of its slot where mask[i, j]), or none:
// causal (row t of sequence b sees keys 0..starts[b] + t); scale: of q.k (1 / sqrt(d) when <= 0).
// -> [N, h d]
torch::Tensor attention(torch::Tensor qkv, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor cos,
                        torch::Tensor sin, std::optional<torch::Tensor> mask, torch::Tensor slots,
                        torch::Tensor starts, torch::Tensor counts, torch::Tensor table, int64_t heads,
                        int64_t kv_heads, double qk_scale) {
  for (auto& [t, name] : {std::pair{qkv, "qkv"}, {cos, "cos"}, {sin, "sin"}}) checks::tensor(t, name);
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "k_cache, v_cache: expected [blocks, kv_heads, block, d]");
  TORCH_CHECK(heads > 0 && kv_heads > 0, "heads, kv_heads: expected positive counts");
  const int64_t N = qkv.size(0), d = qkv.size(1) / (heads + 2 * kv_heads);
  const attn::Cache cache = checks::caches(k_cache, v_cache, d);
  TORCH_CHECK(k_cache.size(3) == checks::row_width(k_cache, d), "k_cache: expected rows of ",
              checks::row_width(k_cache, d), " for heads ", d, " wide");
  TORCH_CHECK(k_cache.size(1) == kv_heads && heads % kv_heads == 0, "k_cache: expected ", kv_heads, " kv heads");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * d, "qkv: expected (heads + 2 kv_heads) * head_dim columns");
  TORCH_CHECK(cos.size(0) == N && sin.size(0) == N && cos.size(1) == d && sin.size(1) == d, "cos/sin: expected [N, head_dim]");
  const attn::Layout layout = checks::layout(slots, starts, counts, table, k_cache.size(0), k_cache.size(2), N);
  const bool* mp = nullptr;
  int64_t mask_cols = 0;
  if (mask) {
    TORCH_CHECK(mask->scalar_type() == torch::kBool && mask->is_contiguous() && mask->dim() == 2 && mask->size(0) == N &&
                    mask->size(1) >= layout.longest, "mask: expected a contiguous bool [N, >= start + count] tensor");
    mp = mask->data_ptr<bool>();
    mask_cols = mask->size(1);
  }
  auto out = torch::empty({N, heads * d}, qkv.options());
  const float scale = qk_scale > 0 ? static_cast<float>(qk_scale) : 1.f / std::sqrt(static_cast<float>(d));
  const attn::Step step{layout, qkv.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                        k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr<float>(), mp, mask_cols,
                        heads, kv_heads, d, scale, cache};
  for (int64_t task = 0; task < N * kv_heads; ++task) step.write(task);
  const int limit = attn::group_limit(d);
  const auto groups = attn::groups(layout, heads, kv_heads, limit);
  const int64_t stride = layout.longest + attn::L;
  at::parallel_for(0, static_cast<int64_t>(groups.size()), 1, [&](int64_t begin, int64_t stop) {
    std::vector<float> q(limit * d), p(limit * stride);
    for (int64_t task = begin; task < stop; ++task) step.group(groups[task], q.data(), p.data(), stride);
  });
  return out;
}

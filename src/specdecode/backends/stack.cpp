// The whole layer stack of a pre-norm model (Llama's form; Qwen2's biases, Qwen3's and Gemma 3's q/k norms,
// Gemma 3's sandwich norms and GELU) in one call (`--dtype gguf`, on tile.h's microkernel for this CPU): every layer's norms,
// matmuls, attention and residual adds for the rows of any sequences, inside one OpenMP team that works
// through the stages together, nothing crossing into Python per layer.
//
// Why: the per-op path (fast_llama.fused_layers) makes ~9 calls a layer, 270 a forward for the
// default model, each paying Python dispatch, tensor allocation and a fork/join of the thread pool;
// the matmuls of a layer are small (the default model's output projection is 0.2 MB), so a
// one-row decoding step spent well above the memory floor (docs/native_forward.md). Here a stage's work (weight groups for a matmul,
// groups of queries for attention, rows for the rest) is shared out as in Stages, and the next stage starts
// when all of it is done. A thread waiting for the rest of a stage prefetches its share of the next
// matmul's weights into its L2 (Ahead): the waits (one row's norm on one thread, attention's 3 kv
// heads over 2 threads, a matmul's last chunks) then stream weights too (docs/native_forward.md).
// Invariant: the stages run the functions of the per-op kernels (tile.h, attention_row.h,
// rowops.h) on the same inputs, and a row's result never depends on the other rows or on which
// thread computed it: a stack row has the bits of the per-op path's row and of a one-token step. Where
// the per-op path runs a torch op (the q/k norms, GELU-tanh), a stage calls the same ATen function on
// the same views of its rows (torch's elementwise and last-dimension kernels treat each row alike).

#include <torch/extension.h>

#include <omp.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attention_row.h"
#include "checks.h"
#include "rowops.h"
#include "tile.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// One interleaved matrix (gguf_weights.Interleaved): n rows in ceil(n / 16) groups.
struct Part {
  int bits;                   // 4, 5, 6 or 8 (tile.h)
  bool half, one, factored;  // one: a single scale per block of 32 (q8_0, q6_0, q5_0); factored: tile::FACTORED
  torch::Tensor scales, quants;
  int64_t n, groups;
};

// A linear made of parts side by side (q|k|v, gate|up): y [M, N] = x [M, K] (W_1 | W_2 | ..)^T.
struct Linear {
  std::vector<Part> parts;
  int64_t K = 0, N = 0, groups = 0;
};

using PartSpec = std::tuple<std::string, torch::Tensor, torch::Tensor, int64_t>;  // kind, scales, quants, n

Linear make_linear(const std::vector<PartSpec>& specs, const char* name) {
  Linear lin;
  for (const auto& [kind, scales, quants, n] : specs) {
    TORCH_CHECK(kind == "q4" || kind == "q8" || kind == "q8_0" || kind == "q6" || kind == "q6_0" || kind == "q5" ||
                    kind == "q5_0",
                name, ": unknown interleaved kind ", kind);
    const int bits = kind[1] - '0';
    const bool half = scales.scalar_type() == torch::kHalf, one = kind.size() == 4;
    const bool factored = scales.scalar_type() == torch::kUInt8;
    const int64_t groups = (n + tile::R - 1) / tile::R, G = quants.size(1);
    TORCH_CHECK(quants.is_contiguous() && quants.scalar_type() == torch::kUInt8 && quants.dim() == 3 &&
                    quants.size(0) == groups && quants.size(2) == bits * 64,
                name, ": quants are not an interleaved ", kind, " matrix of ", n, " rows");
    TORCH_CHECK(scales.is_contiguous() && scales.size(0) == groups &&
                    (factored ? !one && G % 8 == 0 && scales.dim() == 3 && scales.size(1) == G / 8 &&
                                    scales.size(2) == tile::FACTORED
                              : (half || scales.scalar_type() == torch::kFloat32) && scales.dim() == 4 &&
                                    scales.size(1) == G && scales.size(2) == (one ? 1 : 2) && scales.size(3) == tile::R),
                name, ": scales are not an interleaved matrix's");
    TORCH_CHECK(lin.parts.empty() || G * 32 == lin.K, name, ": parts with different input widths");
    lin.K = G * 32;
    lin.N += n;
    lin.groups += groups;
    lin.parts.push_back({bits, half, one, factored, scales, quants, n, groups});
  }
  TORCH_CHECK(!lin.parts.empty(), name, ": no matrices");
  return lin;
}

// field `name` of a parameter object (stack.StackParams), converted to T
template <typename T>
T field(const pybind11::object& p, const char* name) {
  return p.attr(name).cast<T>();
}

// [begin, end) of `total` items for thread t of T, in contiguous even shares
std::pair<int64_t, int64_t> share(int64_t total, int t, int T) { return {total * t / T, total * (t + 1) / T}; }

// Synchronisation of a stage without a barrier: thread t owns its share of the items and takes it front
// to back, a chunk at a time; a thread with nothing left takes chunks from the back of the others'
// shares; the stage is over when every item is done, whoever did it. With a barrier a thread the OS had
// preempted (for the server's HTTP loop, a client on the same cores) stalled its partner at each of
// ~300 barriers a forward: under one streaming client 70% of the forward was spent waiting there.
// Which thread computes an item never changes its bits. Counters start at zero (no set-up per stage).
struct alignas(64) Counter {
  std::atomic<uint64_t> v{0};  // a share: (items taken from its front << 32) | items taken from its back
};

class Stages {
 public:
  Stages(int64_t stages, int threads) : T_(threads), c_(new Counter[stages * (threads + 1)]) {}

  // f(begin, end) over items [0, n) of stage `s` (chunks of at most `chunk`) -> once all n are done
  template <typename F, typename Idle>
  void run(int64_t s, int t, int64_t n, int64_t chunk, F&& f, Idle&& idle) {
    Counter* shares = c_.get() + s * (T_ + 1);
    std::atomic<uint64_t>& done = shares[T_].v;
    int64_t b, e;
    for (auto [lo, hi] = share(n, t, T_); take(shares[t].v, lo, hi, chunk, true, b, e);) {
      f(b, e);
      done.fetch_add(e - b, std::memory_order_release);
    }
    for (int k = 1; k < T_; ++k) {
      const int u = (t + k) % T_;
      for (auto [lo, hi] = share(n, u, T_); take(shares[u].v, lo, hi, chunk, false, b, e);) {
        f(b, e);
        done.fetch_add(e - b, std::memory_order_release);
      }
    }
    for (int spins = 0; done.load(std::memory_order_acquire) < static_cast<uint64_t>(n); ++spins) {
      if (idle())
        spins = 0;
      else if (spins >= 2000)
        std::this_thread::yield();
#if defined(__x86_64__)
      else
        _mm_pause();
#endif
    }
  }

 private:
  // up to `chunk` untaken items of share [lo, hi) from its front (or back) -> [b, e); false: none left
  static bool take(std::atomic<uint64_t>& v, int64_t lo, int64_t hi, int64_t chunk, bool front, int64_t& b,
                   int64_t& e) {
    uint64_t cur = v.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t f = static_cast<int64_t>(cur >> 32), k = static_cast<int64_t>(cur & 0xffffffffu);
      const int64_t left = (hi - k) - (lo + f);
      if (left <= 0) return false;
      const int64_t n = std::min(chunk, left);
      const uint64_t next = front ? cur + (static_cast<uint64_t>(n) << 32) : cur + static_cast<uint64_t>(n);
      if (v.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
        b = front ? lo + f : hi - k - n;
        e = b + n;
        return true;
      }
    }
  }

  int T_;
  std::unique_ptr<Counter[]> c_;
};

// The weights a thread reads next (its share of the next linear), prefetched into its L2 a few lines
// at a time while it waits for a stage's other items.
struct Ahead {
  std::vector<std::pair<const char*, int64_t>> spans;  // (address, bytes), in reading order
  size_t span = 0;
  int64_t off = 0;
  void add(const void* p, int64_t bytes) { spans.emplace_back(static_cast<const char*>(p), bytes); }
  void reset() { spans.clear(), span = 0, off = 0; }
  // prefetches up to `lines` more lines -> whether it did any
  bool step(int lines) {
    bool any = false;
    for (; span < spans.size() && lines > 0; --lines) {
#if defined(__x86_64__)
      _mm_prefetch(spans[span].first + off, _MM_HINT_T1);
#else
      __builtin_prefetch(spans[span].first + off, 0, 2);
#endif
      any = true;
      if ((off += 64) >= spans[span].second) ++span, off = 0;
    }
    return any;
  }
};

// Activation rows quantized for the tiles: room for M rows of up to K inputs.
struct QuantBuffer {
  torch::Tensor q, d, S, h;
  QuantBuffer(int64_t M, int64_t K) {
    q = torch::empty({M, K}, torch::kInt8);
    d = torch::empty({M, K / 32});
    S = torch::empty({M, K / 32});
    h = torch::empty({M, K / 32, 2}, torch::kInt32);
  }
  // row i of x [., k] (k <= K, rows k apart) into the buffer laid out for width k
  void row(const float* x, int64_t i, int64_t k) { put(x + i * k, i, k); }
  // the k values at src into row i of the buffer laid out for width k
  void put(const float* src, int64_t i, int64_t k) {
    const int64_t G = k / 32;
    tile::quantize(src, 1, k, q.data_ptr<int8_t>() + i * k, d.data_ptr<float>() + i * G, S.data_ptr<float>() + i * G,
                   h.data_ptr<int32_t>() + i * 2 * G);
  }
  tile::QuantRows rows() const {
    return {q.data_ptr<int8_t>(), d.data_ptr<float>(), S.data_ptr<float>(), h.data_ptr<int32_t>()};
  }
};

// f(part, g0, g1, col) for each part of lin that weight groups b..e-1 (counted over the parts) reach:
// its groups g0..g1-1, its first output column col
template <typename F>
void for_parts(const Linear& lin, int64_t b, int64_t e, F&& f) {
  int64_t first = 0, col = 0;  // the part's first group among all, its first output column
  for (const Part& p : lin.parts) {
    const int64_t g0 = std::max<int64_t>(b - first, 0), g1 = std::min(e - first, p.groups);
    if (g0 < g1) f(p, g0, g1, col);
    first += p.groups;
    col += p.n;
  }
}

// Weight groups b..e-1 of lin, for all M quantized rows -> y [M, lin.N]
void linear_range(const Linear& lin, const tile::QuantRows& x, int64_t M, float* y, int64_t b, int64_t e) {
  const int64_t G = lin.K / 32;
  for_parts(lin, b, e, [&](const Part& p, int64_t g0, int64_t g1, int64_t col) {
    const auto* wq = p.quants.data_ptr<uint8_t>();
    auto run = [&](auto* ws) {
      using Scale = std::remove_cv_t<std::remove_pointer_t<decltype(ws)>>;
      if (p.bits == 4)
        tile::groups<4, Scale>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
      else if (p.bits == 6 && p.one)
        tile::groups<6, Scale, true>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
      else if (p.bits == 6)
        tile::groups<6, Scale>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
      else if (p.bits == 5 && p.one)
        tile::groups<5, Scale, true>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
      else if (p.bits == 5)
        tile::groups<5, Scale>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
      else if (p.one)
        tile::groups<8, Scale, true>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
      else
        tile::groups<8, Scale>(wq, ws, x, y + col, lin.N, M, G, p.n, g0, g1);
    };
    if (p.factored)
      run(p.scales.data_ptr<uint8_t>());
    else if (p.half)
      run(reinterpret_cast<const tile::f16*>(p.scales.data_ptr<at::Half>()));
    else
      run(p.scales.data_ptr<float>());
  });
}

// thread t's share of lin's weight groups (quants and scales), in the order it reads them -> ahead
void plan_ahead(const Linear& lin, int t, int T, Ahead& ahead) {
  ahead.reset();
  const auto [b, e] = share(lin.groups, t, T);
  const int64_t G = lin.K / 32;
  for_parts(lin, b, e, [&](const Part& p, int64_t g0, int64_t g1, int64_t) {
    const int64_t qb = G * p.bits * 64,
                  sb = p.factored ? tile::scale_stride<uint8_t>(G) : G * (p.one ? 16 : 32) * (p.half ? 2 : 4);
    ahead.add(static_cast<const char*>(p.scales.data_ptr()) + g0 * sb, (g1 - g0) * sb);
    ahead.add(p.quants.data_ptr<uint8_t>() + g0 * qb, (g1 - g0) * qb);
  });
}

}  // namespace

// The layers of a pre-norm model (SiLU- or GELU-tanh-gated MLP; optional q|k|v biases: Qwen2; q/k norms:
// Qwen3, Gemma 3; norms after attention and MLP: Gemma 3) whose linears are all interleaved tile
// matrices, and its LM head when that is one too; made once at load (stack.build). The head in the same
// call: no second call and fork of the thread pool, and its weight groups shared out like a layer's, so
// a thread the OS preempted is not waited for.
class Stack {
 public:
  // p: a stack.StackParams, its fields read by name (their meaning is documented there): qkv, o, gate_up,
  // down (per layer, the linear's parts), norm1, norm2, final_norm, rope_kind and window_kind (per layer,
  // the index of its rotary table and mask in forward's lists; empty: all 0), heads, kv_heads, head_dim,
  // eps, qk_scale (0: 1 / sqrt(head_dim)), head (the LM head's parts, or none: the caller applies its
  // head), pair_norm (None, or [H] for a first layer whose q|k|v read two rows side by side,
  // [pair_norm(emb); norm1(x)] (2H inputs, an EAGLE head's layer: forward's `emb`, the token's embedding,
  // beside the residual stream x, the feature it continues)), qkv_bias (empty, or per layer
  // [(heads + 2 kv_heads) head_dim] added to q|k|v's rows (Qwen2), the one float add the per-op path's
  // QuantLinear makes, so a row keeps its bits), q_norm, k_norm (empty, or per layer [head_dim]: each q
  // and k head RMS-normed after q|k|v, Qwen3 and Gemma 3), post_attn_norm, post_mlp_norm (empty, or per
  // layer [H]: the attention's and the MLP's outputs normed before their residual adds, Gemma 3),
  // activation ("silu" or "gelu_tanh": the MLP's gate).
  explicit Stack(const pybind11::object& p)
      : qkv_bias_(field<std::vector<torch::Tensor>>(p, "qkv_bias")),
        pair_norm_(field<std::optional<torch::Tensor>>(p, "pair_norm").value_or(torch::Tensor())),
        pair_(pair_norm_.defined()),
        norm1_(field<std::vector<torch::Tensor>>(p, "norm1")),
        norm2_(field<std::vector<torch::Tensor>>(p, "norm2")),
        final_norm_(field<torch::Tensor>(p, "final_norm")),
        rope_kind_(field<std::vector<int64_t>>(p, "rope_kind")),
        window_kind_(field<std::vector<int64_t>>(p, "window_kind")),
        heads_(field<int64_t>(p, "heads")),
        kv_heads_(field<int64_t>(p, "kv_heads")),
        d_(field<int64_t>(p, "head_dim")),
        eps_(field<double>(p, "eps")),
        q_norm_(field<std::vector<torch::Tensor>>(p, "q_norm")),
        k_norm_(field<std::vector<torch::Tensor>>(p, "k_norm")),
        post_attn_norm_(field<std::vector<torch::Tensor>>(p, "post_attn_norm")),
        post_mlp_norm_(field<std::vector<torch::Tensor>>(p, "post_mlp_norm")) {
    using Parts = std::vector<std::vector<PartSpec>>;
    const auto qkv = field<Parts>(p, "qkv"), o = field<Parts>(p, "o"), gate_up = field<Parts>(p, "gate_up"),
               down = field<Parts>(p, "down");
    const auto head = field<std::vector<PartSpec>>(p, "head");
    const double qk_scale = field<double>(p, "qk_scale");
    const int64_t heads = heads_, kv_heads = kv_heads_, head_dim = d_;
    const size_t n = qkv.size();
    if (rope_kind_.empty()) rope_kind_.assign(n, 0);
    if (window_kind_.empty()) window_kind_.assign(n, 0);
    TORCH_CHECK(o.size() == n && gate_up.size() == n && down.size() == n && norm1_.size() == n && norm2_.size() == n &&
                    rope_kind_.size() == n && window_kind_.size() == n,
                "Stack: one entry per layer expected in every list");
    for (size_t i = 0; i < n; ++i) {
      layers_.push_back({make_linear(qkv[i], "qkv"), make_linear(o[i], "o"), make_linear(gate_up[i], "gate_up"),
                         make_linear(down[i], "down")});
      const auto& l = layers_.back();
      H_ = l.o.N;
      I_ = l.down.K;
      TORCH_CHECK(l.qkv.N == (heads + 2 * kv_heads) * head_dim && l.qkv.K == (pair_ && i == 0 ? 2 : 1) * H_ &&
                      l.o.K == heads * head_dim && l.gate_up.K == H_ && l.gate_up.N == 2 * I_ && l.down.N == H_,
                  "Stack: layer ", i, "'s matrices do not fit heads ", heads, ", kv heads ", kv_heads, ", width ", head_dim);
    }
    for (auto* norms : {&norm1_, &norm2_})
      for (auto& t : *norms) {
        checks::tensor(t, "norm");
        TORCH_CHECK(t.numel() == H_, "norm: expected ", H_, " weights");
      }
    checks::tensor(final_norm_, "final_norm");
    TORCH_CHECK(qkv_bias_.empty() || qkv_bias_.size() == n, "qkv_bias: none, or one per layer");
    TORCH_CHECK(q_norm_.size() == k_norm_.size() && (q_norm_.empty() || q_norm_.size() == n),
                "q_norm, k_norm: none, or one each per layer");
    for (auto* norms : {&q_norm_, &k_norm_})
      for (auto& t : *norms) {
        checks::tensor(t, "q_norm/k_norm");
        TORCH_CHECK(t.numel() == head_dim, "q_norm/k_norm: expected ", head_dim, " weights");
      }
    for (auto* norms : {&post_attn_norm_, &post_mlp_norm_}) {
      TORCH_CHECK(norms->empty() || norms->size() == n, "post_attn_norm, post_mlp_norm: none, or one per layer");
      for (auto& t : *norms) {
        checks::tensor(t, "post norm");
        TORCH_CHECK(t.numel() == H_, "post norm: expected ", H_, " weights");
      }
    }
    const auto activation = field<std::string>(p, "activation");
    TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "activation: silu or gelu_tanh, not ", activation);
    gelu_ = activation == "gelu_tanh";
    for (auto& b : qkv_bias_) {
      checks::tensor(b, "qkv_bias");
      TORCH_CHECK(b.numel() == (heads + 2 * kv_heads) * head_dim, "qkv_bias: expected ", (heads + 2 * kv_heads) * head_dim, " values");
    }
    if (pair_) {
      checks::tensor(pair_norm_, "pair_norm");
      TORCH_CHECK(pair_norm_.numel() == H_, "pair_norm: expected ", H_, " weights");
    }
    scale_ = qk_scale > 0 ? static_cast<float>(qk_scale) : 1.f / std::sqrt(static_cast<float>(d_));
    if (!head.empty()) {
      head_ = make_linear(head, "head");
      TORCH_CHECK(head_->K == H_, "head: expected ", H_, " inputs");
    }
  }

  bool has_head() const { return head_.has_value(); }

  // forward for chains of tokens given as ids, causal (no layer with a sliding window): sequence b's
  // counts[b] tokens at positions starts[b].. of slot slots[b], their embedding and rotary rows gathered
  // here. Why: a forward streams ~100 MB of weights through the caches, so every torch op between two
  // forwards starts cold (the arange, rotary gathers, embedding and index tensors of a decoding step,
  // several times their warm cost: docs/native_forward.md); FastLlama's and BatchedLlama's chains come
  // here instead (stack.py). tokens [N] ids; embed [V, H] float32; cos, sin: per rotary kind
  // [positions, d] tables; feat: with a pair norm, the residual rows [N, H] (updated in place) beside the
  // tokens' embeddings (EAGLE's draft steps), else none; the rest as forward.
  std::vector<torch::Tensor> forward_ids(const std::vector<int64_t>& tokens, std::vector<int64_t> slots,
                                         std::vector<int64_t> starts, std::vector<int64_t> counts, torch::Tensor table,
                                         const torch::Tensor& embed, torch::Tensor k_cache, torch::Tensor v_cache,
                                         const std::vector<torch::Tensor>& cos, const std::vector<torch::Tensor>& sin,
                                         std::vector<int64_t> capture, std::vector<int64_t> logit_rows,
                                         std::optional<torch::Tensor> feat) {
    for (int64_t w : window_kind_) TORCH_CHECK(w == 0, "forward_ids: a layer with a sliding window needs masks");
    checks::tensor(embed, "embed");
    TORCH_CHECK(embed.dim() == 2 && embed.size(1) == H_, "embed: expected [vocab, ", H_, "]");
    TORCH_CHECK(cos.size() == sin.size(), "cos, sin: one table each per rotary kind");
    TORCH_CHECK(starts.size() == slots.size() && counts.size() == slots.size(),
                "slots, starts, counts: one entry per sequence");
    const int64_t N = static_cast<int64_t>(tokens.size()), V = embed.size(0);
    std::vector<int64_t> positions;
    for (size_t b = 0; b < slots.size(); ++b)
      for (int64_t i = 0; i < counts[b]; ++i) positions.push_back(starts[b] + i);
    TORCH_CHECK(static_cast<int64_t>(positions.size()) == N, "counts: expected ", N, " tokens in all, got ",
                positions.size());
    auto x = torch::empty({N, H_});
    for (int64_t i = 0; i < N; ++i) {
      TORCH_CHECK(tokens[i] >= 0 && tokens[i] < V, "tokens: id ", tokens[i], " outside the vocabulary of ", V);
      std::copy_n(embed.data_ptr<float>() + tokens[i] * H_, H_, x.data_ptr<float>() + i * H_);
    }
    std::vector<torch::Tensor> rows_cos, rows_sin;
    for (size_t k = 0; k < cos.size(); ++k) {
      checks::tensor(cos[k], "cos");
      checks::tensor(sin[k], "sin");
      TORCH_CHECK(cos[k].dim() == 2 && cos[k].size(1) == d_ && sin[k].sizes() == cos[k].sizes(),
                  "cos/sin: expected [positions, ", d_, "] tables");
      rows_cos.push_back(torch::empty({N, d_}));
      rows_sin.push_back(torch::empty({N, d_}));
      for (int64_t i = 0; i < N; ++i) {
        TORCH_CHECK(positions[i] >= 0 && positions[i] < cos[k].size(0), "position ", positions[i],
                    " outside the rotary tables of ", cos[k].size(0));
        std::copy_n(cos[k].data_ptr<float>() + positions[i] * d_, d_, rows_cos[k].data_ptr<float>() + i * d_);
        std::copy_n(sin[k].data_ptr<float>() + positions[i] * d_, d_, rows_sin[k].data_ptr<float>() + i * d_);
      }
    }
    const auto longs = torch::TensorOptions().dtype(torch::kLong);
    auto tensor = [&](std::vector<int64_t>& v) { return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, longs); };
    std::optional<torch::Tensor> emb;
    TORCH_CHECK(feat.has_value() == pair_, pair_ ? "feat: a stack with a pair norm needs the residual rows"
                                                 : "feat: only a stack with a pair norm takes residual rows");
    if (feat) {  // the gathered rows are the embeddings beside the residual stream
      emb = x;
      x = *feat;
    }
    return forward(x, k_cache, v_cache, rows_cos, rows_sin, std::vector<std::optional<torch::Tensor>>(1),
                   tensor(slots), tensor(starts), tensor(counts), table, std::move(capture), std::move(logit_rows), emb);
  }

  // x [N, H] float32: the embedded rows (the residual stream, updated in place); k_cache, v_cache
  // [layers, blocks, kv_heads, block, d] float32 or float16; cos, sin: per rotary kind [N, d]; masks: per window kind
  // [N, >= start + count] bool or none (causal); slots, starts, counts [B] long: sequence b's rows
  // next in x; table [S, per_slot] long: each slot's cache blocks (attention_row.h's Layout); capture: layer ids whose output rows to return; logit_rows: the rows whose logits to
  // return (needs a head); emb: with a pair norm, the rows [N, H] read beside x by the first q|k|v, else
  // none -> [the rows after the final norm [N, H], their logits [len(logit_rows), V], then each captured
  // layer's output [N, H] (the last layer's: after the final norm)]
  std::vector<torch::Tensor> forward(torch::Tensor x, torch::Tensor k_cache, torch::Tensor v_cache,
                                     std::vector<torch::Tensor> cos, std::vector<torch::Tensor> sin,
                                     std::vector<std::optional<torch::Tensor>> masks, torch::Tensor slots,
                                     torch::Tensor starts, torch::Tensor counts, torch::Tensor table,
                                     std::vector<int64_t> capture,
                                     std::vector<int64_t> logit_rows, std::optional<torch::Tensor> emb) {
    checks::tensor(x, "x");
    const attn::Cache cache = checks::caches(k_cache, v_cache, d_);
    const int64_t N = x.size(0), layers = static_cast<int64_t>(layers_.size());
    TORCH_CHECK(x.dim() == 2 && x.size(1) == H_, "x: expected [N, ", H_, "]");
    TORCH_CHECK(emb.has_value() == pair_, pair_ ? "emb: a stack with a pair norm needs the embedding rows"
                                                : "emb: only a stack with a pair norm takes embedding rows");
    if (emb) {
      checks::tensor(*emb, "emb");
      TORCH_CHECK(emb->sizes() == x.sizes(), "emb: expected [N, ", H_, "] as x");
    }
    TORCH_CHECK(k_cache.dim() == 5 && v_cache.sizes() == k_cache.sizes() && k_cache.size(0) == layers &&
                    k_cache.size(2) == kv_heads_ && k_cache.size(4) == checks::row_width(k_cache, d_),
                "k_cache, v_cache: expected [", layers, ", blocks, ", kv_heads_, ", block, ", d_, "]");
    const int64_t layer_size = k_cache[0].numel() * k_cache.element_size();  // bytes
    const attn::Layout layout = checks::layout(slots, starts, counts, table, k_cache.size(1), k_cache.size(3), N);
    TORCH_CHECK(cos.size() == sin.size(), "cos, sin: one table each per rotary kind");
    for (size_t k = 0; k < cos.size(); ++k) {
      checks::tensor(cos[k], "cos");
      checks::tensor(sin[k], "sin");
      TORCH_CHECK(cos[k].dim() == 2 && cos[k].size(0) == N && cos[k].size(1) == d_ && sin[k].sizes() == cos[k].sizes(),
                  "cos/sin: expected [N, ", d_, "]");
    }
    for (auto& m : masks)
      if (m)
        TORCH_CHECK(m->scalar_type() == torch::kBool && m->is_contiguous() && m->dim() == 2 && m->size(0) == N &&
                        m->size(1) >= layout.longest,
                    "mask: expected a contiguous bool [N, >= start + count] tensor");
    for (int64_t l = 0; l < layers; ++l)
      TORCH_CHECK(rope_kind_[l] < static_cast<int64_t>(cos.size()) && window_kind_[l] < static_cast<int64_t>(masks.size()),
                  "stack: layer ", l, " has no rotary table or mask in this call");
    TORCH_CHECK(logit_rows.empty() || head_, "logit_rows: this stack has no LM head");
    for (int64_t r : logit_rows) TORCH_CHECK(r >= 0 && r < N, "logit_rows: no row ", r, " of ", N);
    const int64_t M = static_cast<int64_t>(logit_rows.size());
    std::vector<torch::Tensor> out{torch::empty({N, H_}), torch::empty({M, head_ ? head_->N : 0})};
    std::vector<float*> captured(layers, nullptr);
    for (int64_t c : capture) {
      TORCH_CHECK(c >= 0 && c < layers, "capture: no layer ", c);
      out.push_back(c == layers - 1 ? out[0] : torch::empty({N, H_}));
      captured[c] = out.back().data_ptr<float>();
    }
    const int64_t hd = heads_ * d_, row_qkv = (heads_ + 2 * kv_heads_) * d_;
    auto qkv = torch::empty({N, row_qkv}), att = torch::empty({N, hd}), delta = torch::empty({N, H_});
    auto gate_up = torch::empty({N, 2 * I_}), act = torch::empty({N, I_});
    QuantBuffer qb(std::max(N, M), std::max({(pair_ ? 2 : 1) * H_, hd, I_}));
    auto pair = torch::empty({pair_ ? N : 0, 2 * H_});  // [pair_norm(emb); norm1(x)] rows
    float *xp = x.data_ptr<float>(), *xn = out[0].data_ptr<float>(), *qkvp = qkv.data_ptr<float>();
    float *attp = att.data_ptr<float>(), *dp = delta.data_ptr<float>(), *gup = gate_up.data_ptr<float>();
    float *actp = act.data_ptr<float>(), *logitp = out[1].data_ptr<float>();
    const tile::QuantRows qr = qb.rows();
    const int limit = attn::group_limit(d_);
    const auto groups = attn::groups(layout, heads_, kv_heads_, limit);
    const int64_t stride = layout.longest + attn::L;
    const int threads = omp_in_parallel() ? 1 : at::get_num_threads();
    const int64_t H = H_, I = I_;
    const bool bias = !qkv_bias_.empty(), qk_norms = !q_norm_.empty();
    // 10 stages a layer (one more each for biases, q/k norms), one before, two for the head
    Stages stages(1 + (10 + bias + qk_norms) * layers + 2, threads);
    const auto floats = torch::TensorOptions().dtype(torch::kFloat32);
#pragma omp parallel num_threads(threads)
    {
      c10::InferenceMode no_autograd;  // the torch ops below (q/k norms, GELU), in this thread too
      const int t = omp_get_thread_num();
      std::vector<float> q(limit * d_), p(limit * stride);
      int64_t stage = 0;
      Ahead ahead;
      auto idle = [&] { return ahead.step(4); };  // 4 lines a turn of the wait: measured best of 2, 4, 8, 16
      auto each = [&](int64_t n, int64_t chunk, auto&& f) { stages.run(stage++, t, n, chunk, f, idle); };
      auto rows = [&](auto&& f) {
        each(N, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) f(i);
        });
      };
      auto linear = [&](const Linear& lin, float* y, const Linear* next, int64_t rows_in = -1) {  // chunks: a quarter of a share
        ahead.reset();
        if (next) plan_ahead(*next, t, threads, ahead);
        each(lin.groups, std::max<int64_t>(1, lin.groups / (4 * threads)),
             [&](int64_t b, int64_t e) { linear_range(lin, qr, rows_in < 0 ? N : rows_in, y, b, e); });
      };
      // rows b..e-1 at once (torch ops over them: a row's bits do not depend on its neighbours)
      auto row_chunks = [&](auto&& f) { each(N, std::max<int64_t>(1, (N + threads - 1) / threads), f); };
      // the residual stream x += delta (unless first; normed by `post` first where given), normed by w
      // into xn, quantized for the next linear
      auto norm = [&](bool add, const torch::Tensor& w, int64_t layer_before, bool quantize,
                      const torch::Tensor* post = nullptr) {
        rows([&](int64_t i) {
          if (post) rowops::rms_norm_row(dp + i * H, post->data_ptr<float>(), dp + i * H, H, eps_);
          if (add) rowops::add_row(xp + i * H, dp + i * H, H);
          rowops::rms_norm_row(xp + i * H, w.data_ptr<float>(), xn + i * H, H, eps_);
          if (layer_before >= 0 && layer_before < layers - 1 && captured[layer_before])
            std::copy(xp + i * H, xp + (i + 1) * H, captured[layer_before] + i * H);
          if (quantize) qb.row(xn, i, H);
        });
      };
      if (pair_)
        rows([&](int64_t i) {
          float* row = pair.data_ptr<float>() + i * 2 * H;
          rowops::rms_norm_row(emb->data_ptr<float>() + i * H, pair_norm_.data_ptr<float>(), row, H, eps_);
          rowops::rms_norm_row(xp + i * H, norm1_[0].data_ptr<float>(), row + H, H, eps_);
          qb.put(row, i, 2 * H);
        });
      else
        norm(false, norm1_[0], -1, true);
      for (int64_t l = 0; l < layers; ++l) {
        const Layer& w = layers_[l];
        linear(w.qkv, qkvp, &w.o);
        if (bias) rows([&](int64_t i) { rowops::add_row(qkvp + i * row_qkv, qkv_bias_[l].data_ptr<float>(), row_qkv); });
        if (qk_norms)  // the per-op path's torch op (layer.Layer.norm_qk) on the same views of the rows
          row_chunks([&](int64_t b, int64_t e) {
            auto per_head = torch::from_blob(qkvp + b * row_qkv, {e - b, heads_ + 2 * kv_heads_, d_}, floats);
            auto q = per_head.narrow(1, 0, heads_), k = per_head.narrow(1, heads_, kv_heads_);
            q.copy_(at::rms_norm(q, {d_}, q_norm_[l], eps_));
            k.copy_(at::rms_norm(k, {d_}, k_norm_[l], eps_));
          });
        const auto& mask = masks[window_kind_[l]];
        const attn::Step step{layout,
                              qkvp,
                              cos[rope_kind_[l]].data_ptr<float>(),
                              sin[rope_kind_[l]].data_ptr<float>(),
                              static_cast<char*>(k_cache.data_ptr()) + l * layer_size,
                              static_cast<char*>(v_cache.data_ptr()) + l * layer_size,
                              attp,
                              mask ? mask->data_ptr<bool>() : nullptr,
                              mask ? mask->size(1) : 0,
                              heads_,
                              kv_heads_,
                              d_,
                              scale_,
                              cache};
        each(N * kv_heads_, 1, [&](int64_t b, int64_t e) {
          for (int64_t task = b; task < e; ++task) step.write(task);
        });
        each(static_cast<int64_t>(groups.size()), 1, [&](int64_t b, int64_t e) {
          for (int64_t task = b; task < e; ++task) step.group(groups[task], q.data(), p.data(), stride);
        });
        rows([&](int64_t i) { qb.row(attp, i, hd); });
        linear(w.o, dp, &w.gate_up);
        norm(true, norm2_[l], -1, true, post_attn_norm_.empty() ? nullptr : &post_attn_norm_[l]);
        linear(w.gate_up, gup, &w.down);
        if (gelu_)  // the per-op path's torch GELU (tanh) on the same view of the gates, times up
          row_chunks([&](int64_t b, int64_t e) {
            const auto gate = torch::from_blob(gup + b * 2 * I, {e - b, I}, {2 * I, 1}, floats);
            const auto g = at::gelu(gate, "tanh");
            const float* gp = g.data_ptr<float>();
            for (int64_t i = b; i < e; ++i) {
              for (int64_t j = 0; j < I; ++j) actp[i * I + j] = gp[(i - b) * I + j] * gup[i * 2 * I + I + j];
              qb.row(actp, i, I);
            }
          });
        else
          rows([&](int64_t i) {
            rowops::silu_mul_row(gup + i * 2 * I, gup + i * 2 * I + I, actp + i * I, I);
            qb.row(actp, i, I);
          });
        linear(w.down, dp, l + 1 < layers ? &layers_[l + 1].qkv : (M > 0 ? &*head_ : nullptr));
        const bool last = l == layers - 1;
        const torch::Tensor* post_mlp = post_mlp_norm_.empty() ? nullptr : &post_mlp_norm_[l];
        norm(true, last ? final_norm_ : norm1_[l + 1], l, !last, post_mlp);
      }
      if (M > 0) {  // the LM head for the rows asked for, their normed rows quantized first
        each(M, 1, [&](int64_t b, int64_t e) {
          for (int64_t m = b; m < e; ++m) qb.put(xn + logit_rows[m] * H, m, H);
        });
        linear(*head_, logitp, nullptr, M);
      }
    }
    return out;
  }

 private:
  struct Layer {
    Linear qkv, o, gate_up, down;
  };
  std::vector<Layer> layers_;
  std::optional<Linear> head_;
  std::vector<torch::Tensor> qkv_bias_;
  torch::Tensor pair_norm_;
  bool pair_;
  std::vector<torch::Tensor> norm1_, norm2_;
  torch::Tensor final_norm_;
  std::vector<int64_t> rope_kind_, window_kind_;
  int64_t heads_, kv_heads_, d_, H_ = 0, I_ = 0;
  double eps_;
  std::vector<torch::Tensor> q_norm_, k_norm_, post_attn_norm_, post_mlp_norm_;
  bool gelu_ = false;
  float scale_;
};

void bind_stack(pybind11::module& m) {
  pybind11::class_<Stack>(m, "Stack", pybind11::module_local(), "A Llama-form model's layers on the interleaved tile kernels, one call a forward")
      .def(pybind11::init<const pybind11::object&>(), pybind11::arg("params"),
           "the stack of a stack.StackParams (its fields read by name)")
      .def_property_readonly("has_head", &Stack::has_head)
      .def("forward_ids", &Stack::forward_ids, pybind11::call_guard<pybind11::gil_scoped_release>(),
           "forward for chains of token ids (sequence b's counts[b] at positions starts[b].. of slot slots[b], "
           "its blocks in table's row), "
           "causal, embedding and rotary rows gathered natively")
      .def("forward", &Stack::forward, pybind11::call_guard<pybind11::gil_scoped_release>(),
           "the layers (and head) for rows of any sequences -> [rows after the final norm, logits of logit_rows, "
           "captured layers' outputs...]");
}

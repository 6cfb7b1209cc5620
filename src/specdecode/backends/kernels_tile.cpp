// `--dtype gguf` matmuls on tile.h's interleaved layout: weight rows interleaved 16 at a time, so that
// one multiply-add of bytes yields partial sums for 16 (AVX-512 VNNI), 8 (AVX2, AVX-VNNI) or 4 (NEON)
// weight rows and each unpacked block serves every row of x; the microkernel is this build's ISA's
// (tile.h).
//
// Why: a kernel that forms one weight row's dot product with each x row in turn (a dot, a conversion
// and an FMA per 32 weights per row of x, a horizontal sum per output) makes verifying k drafts pay
// almost a full pass per extra row (docs/native_forward.md). Here a block of 32 weights of 16 rows is
// 4 x 64 bytes of nibbles, unpacked once; each row of x then costs a few byte multiply-adds with its
// 4 activation bytes broadcast, one conversion and two FMAs per lane, and no horizontal sums (ggml's
// repacked Q4_0x8 and ik_llama.cpp's unpackers are the idea; the layout and code are ours).
//
// Layout (pack_*): rows in groups of 16 (the last group zero-padded); per group and block of 32:
//   q4: 4 x 64 bytes; register t holds, for row l, the 4 bytes t*4..t*4+3 of its block as the file
//       stores them (weight j in byte j's low nibble, j + 16 in its high), so its low nibbles are
//       weights 4t..4t+3 and its high nibbles weights 16+4t..16+4t+3: registers U_0..U_7 cover the
//       block 4 weights at a time, in order.
//   q8: 8 x 64 bytes, register t: weights 4t..4t+3 of row l, plus 128 (byte multiply-adds take
//       unsigned by signed bytes; 128 * sum(x) is subtracted back exactly, in integers).
//   q6, q5: q8 matrices whose weights fit 6 or 5 bits, kept so (tile_ref.h says how).
//   scales [groups, G, 2, 16]: q4 (s, o) of the 16 rows, q8 (s of weights 0..15, of 16..31); float16
//       where that holds them exactly (the fp16 d and m of Q4_0/Q4_1/Q5_0/Q8_0: 14% fewer bytes per
//       step), else float32. q8_0 (linear_q8_0_tile): a q8 matrix whose two scales are equal in every
//       block (Q8_0, Q5_0) keeps one, [groups, G, 1, 16]. K-quants' sub-block scales, products of a
//       super-block's float16 factor and a small integer, are kept factored as the file keeps them
//       (uint8 [groups, G / 8, tile::FACTORED], tile.h): 40 bytes a block of 16 rows instead of
//       128, 23% fewer bytes per step on a Q4_K matrix, 14% on a Q6_K one.
// Invariant: each row of x is quantized on its own and its sums are formed in the same order whatever
// the other rows: verifying k drafts gives the bits of k single-token steps, and a batch gives each
// request the bits it gets alone, on every ISA (tests/native/tile_check.cpp).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "tile.h"

namespace {

using namespace tile;

template <int BITS, bool ONE = false>
torch::Tensor matmul(const torch::Tensor& x, const torch::Tensor& scales, const torch::Tensor& quants, int64_t N) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2,
              "x: expected a contiguous CPU float32 [M, K] tensor");
  const int64_t M = x.size(0), K = x.size(1), G = K / 32, groups = (N + R - 1) / R;
  TORCH_CHECK(K % 32 == 0, "interleaved linear: x.size(1) must be a multiple of 32");
  TORCH_CHECK(quants.is_contiguous() && quants.dim() == 3 && quants.size(0) == groups && quants.size(1) == G &&
                  quants.size(2) == BITS * 64 && quants.scalar_type() == torch::kUInt8,
              "quants: expected a contiguous uint8 [ceil(N / 16), K / 32, ", BITS * 64, "] tensor");
  const bool half = scales.scalar_type() == torch::kHalf, factored = scales.scalar_type() == torch::kUInt8;
  TORCH_CHECK(!factored || (!ONE && G % 8 == 0 && scales.is_contiguous() && scales.dim() == 3 &&
                            scales.size(0) == groups && scales.size(1) == G / 8 && scales.size(2) == FACTORED),
              "scales: expected factored uint8 scales [ceil(N / 16), K / 256, ", FACTORED, "]");
  TORCH_CHECK(factored || (scales.is_contiguous() && (half || scales.scalar_type() == torch::kFloat32) &&
                           scales.dim() == 4 && scales.size(0) == groups && scales.size(1) == G &&
                           scales.size(2) == (ONE ? 1 : 2) && scales.size(3) == R),
              "scales: expected a contiguous float32 or float16 [ceil(N / 16), K / 32, ", ONE ? 1 : 2, ", 16] tensor");
  auto xq = torch::empty({M, K}, x.options().dtype(torch::kInt8));
  auto xd = torch::empty({M, G}, x.options()), xS = torch::empty({M, G}, x.options());
  auto xh = torch::empty({M, G, 2}, x.options().dtype(torch::kInt32));
  quantize(x.data_ptr<float>(), M, K, xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xS.data_ptr<float>(),
           xh.data_ptr<int32_t>());
  auto y = torch::empty({M, N}, x.options());
  const auto* wq = quants.data_ptr<uint8_t>();
  const QuantRows rows{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xS.data_ptr<float>(), xh.data_ptr<int32_t>()};
  float* yp = y.data_ptr<float>();
  auto run = [&](auto* ws) {
    using Scale = std::remove_cv_t<std::remove_pointer_t<decltype(ws)>>;
    at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
      tile::groups<BITS, Scale, ONE>(wq, ws, rows, yp, N, M, G, N, g0, g1);
    });
  };
  if (factored) {
    if constexpr (!ONE) run(scales.data_ptr<uint8_t>());
  } else if (half) {
    run(reinterpret_cast<const f16*>(scales.data_ptr<at::Half>()));
  } else {
    run(scales.data_ptr<float>());
  }
  return y;
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

// The ISA of this build's tile microkernel: avx512vnni, avxvnni, avx2, i8mm, neon or scalar (tile.h).
std::string tile_isa() { return SPECDECODE_TILE_ISA; }
std::string tile_prefetch() {
#if defined(SPECDECODE_TILE_AVX512) || defined(SPECDECODE_TILE_AVX2)
  return tile::ahead_into_l2 ? "l2" : "l1";
#elif defined(SPECDECODE_TILE_NEON)
  return "l1";  // tile_neon.h's __builtin_prefetch
#else
  return "none";
#endif
}

// x: [M, K] float32, each row quantized to 8 bits per block of 32; W: N interleaved 4-bit rows
// (pack_q4_tile) -> x W^T [M, N] float32
torch::Tensor linear_q4_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<4>(x, scales, quants, N);
}

// The same for 8-bit rows (pack_q8_tile)
torch::Tensor linear_q8_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<8>(x, scales, quants, N);
}

// The same for 8-bit rows with one scale per block of 32 (Q8_0; pack_q8_tile's scales, one of each
// block's two equal halves kept: [ceil(N / 16), K / 32, 1, 16])
torch::Tensor linear_q8_0_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<8, true>(x, scales, quants, N);
}

// The same for 6-bit rows (gguf_weights.Interleaved.pack's "q6": quants [ceil(N / 16), K / 32, 384])
torch::Tensor linear_q6_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<6>(x, scales, quants, N);
}

// ... with one scale per block of 32 ("q6_0")
torch::Tensor linear_q6_0_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<6, true>(x, scales, quants, N);
}

// The same for 5-bit rows ("q5": weights in -16..15, quants [ceil(N / 16), K / 32, 320])
torch::Tensor linear_q5_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<5>(x, scales, quants, N);
}

// ... with one scale per block of 32 ("q5_0": Q5_0's blocks)
torch::Tensor linear_q5_0_tile(torch::Tensor x, torch::Tensor scales, torch::Tensor quants, int64_t N) {
  return matmul<5, true>(x, scales, quants, N);
}

std::vector<torch::Tensor> pack_q4_tile(torch::Tensor scales, torch::Tensor quants) { return pack<true>(scales, quants); }
std::vector<torch::Tensor> pack_q8_tile(torch::Tensor scales, torch::Tensor quants) { return pack<false>(scales, quants); }
std::vector<torch::Tensor> unpack_q4_tile(torch::Tensor ps, torch::Tensor pq, int64_t N) { return unpack<true>(ps, pq, N); }
std::vector<torch::Tensor> unpack_q8_tile(torch::Tensor ps, torch::Tensor pq, int64_t N) { return unpack<false>(ps, pq, N); }

// Which tiles of x rows meet which weight rows, for kernels.cpp's float and exact-dequantized matmuls.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

// Rows of x per pass over a weight row: with AVX-512's 32 vector registers, 8 rows keep their
// accumulators in registers; AVX2 gets by on 16.
constexpr int64_t MAX_MB = 8;

// Calls tile(std::integral_constant<int, MB>{}, r, m0) so that every weight row r < N meets every
// x row m < M exactly once, in a tile of MB <= MAX_MB rows from m0. Weight rows are split between
// threads. x rows go in blocks of about `block_bytes` (kept in L2 while a thread's weight rows
// stream past: one pass over the weights per block, not per tile), each block in balanced tiles
// (9 rows: 5 + 4, not 8 + 1), during which the weight row stays in L1. The order never changes a
// sum: each (r, m) is formed inside one tile, the same way in every tile shape.
template <typename Tile>
void for_tiles(int64_t M, int64_t N, int64_t row_bytes, const Tile& tile, int64_t block_bytes = 128 << 10) {
  const int64_t block = std::max<int64_t>(MAX_MB, block_bytes / std::max<int64_t>(row_bytes, 1) / MAX_MB * MAX_MB);
  at::parallel_for(0, N, 128, [&](int64_t r0, int64_t r1) {
    for (int64_t b0 = 0; b0 < M; b0 += block) {
      const int64_t end = std::min(M, b0 + block), passes = (end - b0 + MAX_MB - 1) / MAX_MB;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t p = 0, m0 = b0; p < passes; ++p) {
          const int64_t mb = (end - m0 + (passes - p) - 1) / (passes - p);  // rows left spread over tiles left
          switch (mb) {
            case 1: tile(std::integral_constant<int, 1>{}, r, m0); break;
            case 2: tile(std::integral_constant<int, 2>{}, r, m0); break;
            case 3: tile(std::integral_constant<int, 3>{}, r, m0); break;
            case 4: tile(std::integral_constant<int, 4>{}, r, m0); break;
            case 5: tile(std::integral_constant<int, 5>{}, r, m0); break;
            case 6: tile(std::integral_constant<int, 6>{}, r, m0); break;
            case 7: tile(std::integral_constant<int, 7>{}, r, m0); break;
            case 8: tile(std::integral_constant<int, 8>{}, r, m0); break;
          }
          m0 += mb;
        }
    }
  });
}

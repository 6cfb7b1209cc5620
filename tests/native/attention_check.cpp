// Bit test of a float16 KV cache (attention_row.h, half.h) with no torch: built by
// tests/test_tile_isa.py for each ISA the CPU can run and for ARM under qemu-aarch64. It checks:
//   - half::from_float on the values given as arguments: prints each one's bits (the test compares
//     them with numpy's float16, round to nearest even);
//   - attention over a paged float16 cache (blocks of 8 in shuffled order) has, for every group size
//     1..6 and head widths 64 (register-blocked) and 24 (the scalar query), the bits of attention over
//     the float32 cache holding the widened values.
// Prints "attention N passed, N failed"; exits 1 on any failure.
#include "attention_row.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) std::printf("%s %u\n", argv[i], half::from_float(std::strtof(argv[i], nullptr)));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  int passed = 0, failed = 0;
  for (const int64_t d : {int64_t{64}, int64_t{24}}) {
    const int64_t n = 45, block = 8, nb = (n + block - 1) / block;
    std::vector<int64_t> blocks(nb);
    for (int64_t b = 0; b < nb; ++b) blocks[b] = (b * 5 + 3) % nb;  // a shuffled table
    std::vector<float> kf(nb * block * d), vf(nb * block * d), q(6 * d), p(6 * (n + 64));
    std::vector<uint16_t> kh(kf.size()), vh(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      kf[i] = half::to_float(kh[i] = half::from_float(normal(rng)));
      vf[i] = half::to_float(vh[i] = half::from_float(normal(rng)));
    }
    for (auto& x : q) x = normal(rng) * 0.125f;
    const attn::Keys<float> wide{kf.data(), vf.data(), blocks.data(), block * d, block};
    const attn::Keys<uint16_t> narrow{kh.data(), vh.data(), blocks.data(), block * d, block};
    for (int G = 1; G <= (d == 64 ? attn::group_limit(d) : 1); ++G) {
      int64_t ends[attn::MAX_GROUP];
      const bool* seen[attn::MAX_GROUP] = {};
      std::vector<float> a(G * d), b(G * d);
      float *oa[attn::MAX_GROUP], *ob[attn::MAX_GROUP];
      for (int g = 0; g < G; ++g) ends[g] = n - g, oa[g] = a.data() + g * d, ob[g] = b.data() + g * d;
      if (const auto fa = attn::for_group<float>(d, G)) {
        fa(q.data(), wide, ends, seen, p.data(), n + 64, oa);
        attn::for_group<uint16_t>(d, G)(q.data(), narrow, ends, seen, p.data(), n + 64, ob);
      } else {
        attn::query_any(q.data(), wide, d, ends[0], nullptr, p.data(), oa[0]);
        attn::query_any(q.data(), narrow, d, ends[0], nullptr, p.data(), ob[0]);
      }
      const bool same = a == b;
      if (!same) std::printf("FAIL d=%ld G=%d: float16 cache differs from its widened float32\n", long(d), G);
      (same ? passed : failed) += 1;
    }
  }
  std::printf("attention %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

// Bit test of this build's tile microkernel (tile.h) against the portable reference (tile_ref.h), with
// no torch: built by tests/test_tile_isa.py for this CPU, for each ISA the CPU can run, and for ARM
// (run under qemu-aarch64). For every kind of matrix (4, 5, 6, 8 bits; float32, float16 or factored
// scales; one scale a block or two), every rows-of-x count 1..17, 24 and 33 (one, two and three passes of
// AVX-512's 16 rows, more of the others' 8) and partial last groups, it checks:
//   - every output has the reference's bits;
//   - each row of x has the same bits computed alone as in the batch.
// Prints the ISA, one line per failure, and "N passed, N failed"; exits 1 on any failure.
#include "tile.h"

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

std::mt19937 rng(1234);

uint16_t random_half() {  // a normal float16 of magnitude 2^-10..2^2, either sign
  const uint16_t exp = 5 + rng() % 12, man = rng() % 1024, sign = rng() % 2;
  return static_cast<uint16_t>(sign << 15 | exp << 10 | man);
}

template <typename Scale>
std::vector<Scale> random_scales(size_t n);
template <>
std::vector<float> random_scales(size_t n) {
  std::vector<float> s(n);
  std::normal_distribution<float> normal(0.f, 0.02f);
  for (auto& v : s) v = normal(rng);
  return s;
}
template <>
std::vector<tile::f16> random_scales(size_t n) {
  std::vector<tile::f16> s(n);
  for (auto& v : s) v.bits = random_half();
  return s;
}
template <>
std::vector<uint8_t> random_scales(size_t n) {  // factored: per super-block 2 x 16 halves, then int8 multipliers
  std::vector<uint8_t> s(n);
  for (size_t i = 0; i < n; i += tile::FACTORED) {
    for (int j = 0; j < 2 * tile::R; ++j) {
      const uint16_t h = random_half();
      std::memcpy(&s[i + 2 * j], &h, 2);
    }
    for (int64_t j = 4 * tile::R; j < tile::FACTORED; ++j) s[i + j] = static_cast<uint8_t>(rng());
  }
  return s;
}

template <int BITS, typename Scale, bool ONE>
int check(const char* name, int& passed) {
  int failed = 0;
  const int64_t G = 16, K = 32 * G;  // two super-blocks
  for (int64_t N : {16, 37}) {
    const int64_t groups = (N + tile::R - 1) / tile::R;
    std::vector<uint8_t> wq(groups * G * BITS * 64);
    for (auto& b : wq) b = static_cast<uint8_t>(rng());
    const auto ws = random_scales<Scale>(groups * tile::scale_stride<Scale, ONE>(G));
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 33}) {
      std::vector<float> x(M * K);
      std::normal_distribution<float> normal(0.f, 1.f);
      for (auto& v : x) v = normal(rng) * (rng() % 7 == 0 ? 30.f : 1.f);
      std::vector<int8_t> q(M * K);
      std::vector<float> d(M * G), S(M * G);
      std::vector<int32_t> h(M * G * 2);
      tile::quantize(x.data(), M, K, q.data(), d.data(), S.data(), h.data());
      const tile::QuantRows rows{q.data(), d.data(), S.data(), h.data()};
      std::vector<float> y(M * N, -1.f), want(M * N, -2.f), alone(N);
      tile::groups<BITS, Scale, ONE>(wq.data(), ws.data(), rows, y.data(), N, M, G, N, 0, groups);
      for (int64_t grp = 0; grp < groups; ++grp)
        for (int64_t m = 0; m < M; ++m)
          tile::ref::group_tile<BITS, Scale, ONE>(wq.data() + grp * G * BITS * 64,
                                                  ws.data() + grp * tile::scale_stride<Scale, ONE>(G), q.data(),
                                                  d.data(), S.data(), h.data(), want.data(), G, N, grp * tile::R,
                                                  std::min(tile::R, N - grp * tile::R), m, 1);
      bool ok = std::memcmp(y.data(), want.data(), y.size() * 4) == 0;
      if (!ok)
        for (int64_t i = 0; i < M * N; ++i)
          if (std::memcmp(&y[i], &want[i], 4) != 0) {
            std::printf("FAIL %s N=%ld M=%ld: row %ld out %ld: %.9g, reference %.9g\n", name, long(N), long(M),
                        long(i / N), long(i % N), y[i], want[i]);
            break;
          }
      for (int64_t m = 0; m < M && ok; ++m) {  // row m alone
        const tile::QuantRows one{q.data() + m * K, d.data() + m * G, S.data() + m * G, h.data() + 2 * m * G};
        tile::groups<BITS, Scale, ONE>(wq.data(), ws.data(), one, alone.data(), N, 1, G, N, 0, groups);
        if (std::memcmp(alone.data(), y.data() + m * N, N * 4) != 0) {
          std::printf("FAIL %s N=%ld M=%ld: row %ld alone differs from the batch\n", name, long(N), long(M), long(m));
          ok = false;
        }
      }
      (ok ? passed : failed) += 1;
    }
  }
  return failed;
}

}  // namespace

int main() {
  std::printf("tile ISA %s, MAX_X %ld\n", SPECDECODE_TILE_ISA, long(tile::MAX_X));
  int passed = 0, failed = 0;
#if defined(SPECDECODE_TILE_AVX2)
  for (const bool halves : {false, true}) {  // both ways of tile_avx2.h's group_tile, whatever this core is
    tile::avx2::halves_sooner = halves;
    std::printf("halves_sooner %d\n", int(halves));
#else
  {
#endif
  failed += check<4, float, false>("q4 float32", passed);
  failed += check<4, tile::f16, false>("q4 float16", passed);
  failed += check<4, uint8_t, false>("q4 factored", passed);
  failed += check<8, float, false>("q8 float32", passed);
  failed += check<8, tile::f16, true>("q8_0 float16", passed);
  failed += check<8, uint8_t, false>("q8 factored", passed);
  failed += check<6, uint8_t, false>("q6 factored", passed);
  failed += check<6, tile::f16, true>("q6_0 float16", passed);
  failed += check<6, float, false>("q6 float32", passed);
  failed += check<5, tile::f16, true>("q5_0 float16", passed);
  failed += check<5, float, false>("q5 float32", passed);
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

// The tile microkernel alone, streaming a 1.5B-sized stack of weights from memory: time, multiply-adds
// a cycle a core and cycles a row of x and block (16 weight rows x 32) for the given rows of x, to tell a
// kernel's compute from the machine's memory stream without the model around it
// (docs/native_forward.md). Build for this CPU's microkernel, or another ISA's flags:
//   g++ -O3 -march=native -fopenmp -std=c++17 -Isrc/specdecode/backends scripts/tile_stream.cpp -o /tmp/ts
//   /tmp/ts THREADS BITS GHZ ROWS MB (defaults 2, 4 (Q4_K; 6: Q6_K), 2.45: the clock the rates are quoted
//   at, 1,2,4,8,16: the rows-of-x counts, comma-separated, 300: megabytes of Q4_K-sized weights)
// With MB below the L2 (e.g. 0.6, one thread) the weights are swept from cache again and again: the
// kernel's compute alone, the floor under its rate from memory.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tile.h"

template <int BITS>
void run(int threads, double ghz, const std::vector<int64_t>& counts, double mb) {
  const int64_t G = 48, K = 32 * G;        // K = 1536, the 1.5B's hidden width
  const int64_t q4_group = G * 4 * 64;    // bytes of a group of 16 rows at Q4_K: what MB counts
  const int64_t groups = std::max<int64_t>(threads, static_cast<int64_t>(mb * 1e6 / q4_group + 0.5));
  const int64_t N = 16 * groups;           // rows: 300 MB of Q4_K groups by default, far past any cache
  const int64_t chunk = std::min<int64_t>(64, (groups + threads - 1) / threads);  // groups a task
  const int sweeps = std::max<int64_t>(1, static_cast<int64_t>(30e6 / (groups * q4_group)));  // a timing's
  std::vector<uint8_t> wq(groups * G * BITS * 64);
  std::mt19937 rng(1);
  for (auto& b : wq) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> ws(groups * tile::scale_stride<uint8_t, false>(G));
  for (auto& b : ws) b = rng() % 64;  // float16 factors with small exponents and int8 sub-scales
  std::printf("%s, Q%d_K, %d threads, %.1f MB of weights, K %ld\n", SPECDECODE_TILE_ISA, BITS, threads,
              wq.size() / 1e6, static_cast<long>(K));
  for (int64_t M : counts) {
    std::vector<float> x(M * K), d(M * G), S(M * G), y(M * N);
    std::normal_distribution<float> nd;
    for (auto& v : x) v = nd(rng);
    std::vector<int8_t> q(M * K);
    std::vector<int32_t> h(M * G * 2);
    tile::quantize(x.data(), M, K, q.data(), d.data(), S.data(), h.data());
    const tile::QuantRows rows{q.data(), d.data(), S.data(), h.data()};
    double best = 1e18;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
      for (int s = 0; s < sweeps; ++s)
        for (int64_t a = omp_get_thread_num() * chunk; a < groups; a += threads * chunk)
          tile::groups<BITS, uint8_t, false>(wq.data(), ws.data(), rows, y.data(), N, M, G, N, a,
                                             std::min(groups, a + chunk));
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / sweeps);
    }
    const double cycles = best * ghz * 1e9 * threads;  // all cores'
    std::printf("rows %2ld: %7.2f ms, %5.2f GB/s, %4.1f multiply-adds a cycle a core, %5.1f cycles a row and block\n",
                static_cast<long>(M), best * 1e3, wq.size() / best / 1e9, double(N) * K * M / cycles,
                cycles / (double(groups) * G * M));
  }
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2, bits = argc > 2 ? std::atoi(argv[2]) : 4;
  const double ghz = argc > 3 ? std::atof(argv[3]) : 2.45;
  std::vector<int64_t> counts;
  for (const char* c = argc > 4 ? argv[4] : "1,2,4,8,16"; *c != 0;) {
    char* end = nullptr;
    const long m = std::strtol(c, &end, 10);
    if (end == c || m < 1 || m > 64 || (*end != ',' && *end != 0)) {
      std::fprintf(stderr, "ROWS: expected counts 1..64 separated by commas, got %s\n", argv[4]);
      return 2;
    }
    counts.push_back(m);
    c = *end == ',' ? end + 1 : end;
  }
  const double mb = argc > 5 ? std::atof(argv[5]) : 300;
  if (threads < 1 || (bits != 4 && bits != 6) || !(ghz > 0) || !(mb > 0)) {
    std::fprintf(stderr, "expected THREADS >= 1, BITS 4 or 6, GHZ > 0, MB > 0\n");
    return 2;
  }
  if (bits == 6)
    run<6>(threads, ghz, counts, mb);
  else
    run<4>(threads, ghz, counts, mb);
}

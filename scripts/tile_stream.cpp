// The tile microkernel alone, streaming a 1.5B-sized stack of weights from memory: time and multiply-adds
// a cycle a core for 1..16 rows of x, to tell a kernel's compute from the machine's memory stream without
// the model around it (docs/native_forward.md). Build for this CPU's microkernel, or another ISA's flags:
//   g++ -O3 -march=native -fopenmp -std=c++17 -Isrc/specdecode/backends scripts/tile_stream.cpp -o /tmp/ts
//   /tmp/ts THREADS BITS GHZ      (defaults 2, 4 (Q4_K; 6: Q6_K), 2.45: the clock the MAC rate is quoted at)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tile.h"

template <int BITS>
void run(int threads, double ghz) {
  const int64_t G = 48, K = 32 * G;        // K = 1536, the 1.5B's hidden width
  const int64_t N = 16 * 1024 * 24;        // rows: ~300 MB of Q4_K groups, far past any cache
  const int64_t groups = N / 16, chunk = 64;  // groups a task, shared out like the stack's
  std::vector<uint8_t> wq(groups * G * BITS * 64);
  std::mt19937 rng(1);
  for (auto& b : wq) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> ws(groups * tile::scale_stride<uint8_t, false>(G));
  for (auto& b : ws) b = rng() % 64;  // float16 factors with small exponents and int8 sub-scales
  std::printf("%s, Q%d_K, %d threads, %.0f MB of weights, K %ld\n", SPECDECODE_TILE_ISA, BITS, threads,
              wq.size() / 1e6, static_cast<long>(K));
  for (int64_t M : {1, 2, 4, 8, 16}) {
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
      for (int64_t a = omp_get_thread_num() * chunk; a < groups; a += threads * chunk)
        tile::groups<BITS, uint8_t, false>(wq.data(), ws.data(), rows, y.data(), N, M, G, N, a,
                                           std::min(groups, a + chunk));
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("rows %2ld: %6.1f ms, %5.2f GB/s, %4.1f multiply-adds a cycle a core\n", static_cast<long>(M),
                best * 1e3, wq.size() / best / 1e9, double(N) * K * M / best / (ghz * 1e9) / threads);
  }
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2, bits = argc > 2 ? std::atoi(argv[2]) : 4;
  const double ghz = argc > 3 ? std::atof(argv[3]) : 2.45;
  if (bits == 6)
    run<6>(threads, ghz);
  else
    run<4>(threads, ghz);
}

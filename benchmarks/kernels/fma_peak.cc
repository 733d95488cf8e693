// This CPU's arithmetic peak from registers alone: independent FMA (float32) or VDPBF16PS (bfloat16 pairs) chains on
// every vector register a tile could use, no loads, on N threads. What the packed matmul's register tile could reach
// if memory and caches cost nothing. Built and run by benchmarks/kernels/w1_kernel_table.py (g++ -O3 -march=native).
// Usage: fma_peak THREADS; prints "float32 WALL CPU" and, with AVX512-BF16, "bfloat16 WALL CPU": GFLOP/s of the
// threads by wall time, and GFLOP per CPU-second of one thread (a pair product and its add count as 4 FLOPs).
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

constexpr int kChains = 16;  // independent accumulators: more than latency x issue width on any x86 core
constexpr long kIterations = 20'000'000;

#if defined(__AVX512F__)
using V = __m512;
constexpr int kLanes = 16;
static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static V Set(float v) { return _mm512_set1_ps(v); }
static float Lane0(V v) { return _mm512_cvtss_f32(v); }
#else
using V = __m256;
constexpr int kLanes = 8;
static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static V Set(float v) { return _mm256_set1_ps(v); }
static float Lane0(V v) { return _mm256_cvtss_f32(v); }
#endif

static float RunFloat32() {
  V sums[kChains];
  for (int c = 0; c < kChains; ++c) sums[c] = Set(0.001f * c);
  V a = Set(0.999f), b = Set(1e-7f);
  for (long i = 0; i < kIterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) sums[c] = Fma(sums[c], a, b);
    __asm__ volatile("" : "+v"(a));  // keeps the multiplier opaque, so the loop is not folded
  }
  float total = 0;
  for (int c = 0; c < kChains; ++c) total += Lane0(sums[c]);
  return total;
}

#if defined(__AVX512BF16__)
static float RunBfloat16() {
  __m512 sums[kChains];
  for (int c = 0; c < kChains; ++c) sums[c] = _mm512_set1_ps(0.001f * c);
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (long i = 0; i < kIterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) sums[c] = _mm512_dpbf16_ps(sums[c], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  float total = 0;
  for (int c = 0; c < kChains; ++c) total += _mm512_cvtss_f32(sums[c]);
  return total;
}
#endif

static double ThreadCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + 1e-9 * now.tv_nsec;
}

// GFLOP/s of `threads` threads by wall time, and per CPU-second of one thread (what a core gives while it runs the
// loop: on a shared machine the wall time also counts the time other processes held the cores).
template <typename Run>
static void Rate(const char* name, int threads, Run run, double flops_per_instruction) {
  std::vector<std::thread> pool;
  std::vector<float> sink(threads);
  std::vector<double> cpu_seconds(threads);
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t]() {
      const double cpu_start = ThreadCpuSeconds();
      sink[t] = run();
      cpu_seconds[t] = ThreadCpuSeconds() - cpu_start;
    });
  }
  for (auto& thread : pool) thread.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile float keep = sink[0];
  (void)keep;
  double cpu_total = 0;
  for (double value : cpu_seconds) cpu_total += value;
  const double flops = threads * kIterations * kChains * flops_per_instruction;
  std::printf("%s %.1f %.1f\n", name, flops / seconds / 1e9, flops / cpu_total / 1e9);
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  Rate("float32", threads, RunFloat32, 2.0 * kLanes);
#if defined(__AVX512BF16__)
  Rate("bfloat16", threads, RunBfloat16, 4.0 * 16);
#endif
  return 0;
}

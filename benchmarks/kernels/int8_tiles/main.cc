// One thread's CPU time of each int8 kernel's tiles against the bfloat16 panels' (packed_matmul.cc), at SmolLM2-135M's
// projection shapes (q/k/v fused, o, gate/up fused, down), with each instruction's peak measured in registers and
// one thread's read bandwidth: GMAC/s, fraction of the peak and of the roofline. Build and run: ./build.sh; ./bench
// [rows ...]. The kernels' sources are #included (their anonymous namespaces) and run item by item on one thread,
// so the figures are the tiles' own, not the thread pool's; CPU time, so other processes' load inflates them little.
#include <immintrin.h>
#include <cstdio>
#include <cstring>
#include <string>
#include "harness.h"
extern "C" double vnni_seconds(int64_t, int64_t, const int64_t*, int, int, int);
extern "C" double bf16_seconds(int64_t, int64_t, const int64_t*, int, int, int);
extern "C" double i8bf16_seconds(int64_t, int64_t, const int64_t*, int, int, int);
extern "C" double vnni_digits_seconds(int64_t, int64_t, const int64_t*, int, int, int);
struct Shape { const char* name; int64_t inner; int n; int64_t outers[3]; };
static const Shape kShapes[] = {{"qkv", 576, 3, {576, 192, 192}}, {"o", 576, 1, {576}}, {"gate_up", 576, 2, {1536, 1536}}, {"down", 1536, 1, {576}}};
double PeakVnni() {  // G instr/s: 24 independent accumulators in registers
  const long n = 4000000; double t0 = Now();
  for (long k = 0; k < n; ++k) {
    __asm__ volatile("vpdpbusd %%zmm1, %%zmm0, %%zmm8\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm9\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm10\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm11\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm12\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm13\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm14\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm15\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm16\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm17\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm18\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm19\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm20\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm21\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm22\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm23\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm24\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm25\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm26\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm27\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm28\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm29\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm30\n\t""vpdpbusd %%zmm1, %%zmm0, %%zmm31\n\t" ::: "zmm8","zmm9","zmm10","zmm11","zmm12","zmm13","zmm14","zmm15","zmm16","zmm17","zmm18","zmm19","zmm20","zmm21","zmm22","zmm23","zmm24","zmm25","zmm26","zmm27","zmm28","zmm29","zmm30","zmm31");
  }
  return n * 24 / (Now() - t0) / 1e9;
}
double PeakBf16() {  // G instr/s: 24 independent accumulators in registers
  const long n = 4000000; double t0 = Now();
  for (long k = 0; k < n; ++k) {
    __asm__ volatile("vdpbf16ps %%zmm1, %%zmm0, %%zmm8\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm9\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm10\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm11\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm12\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm13\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm14\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm15\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm16\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm17\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm18\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm19\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm20\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm21\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm22\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm23\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm24\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm25\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm26\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm27\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm28\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm29\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm30\n\t""vdpbf16ps %%zmm1, %%zmm0, %%zmm31\n\t" ::: "zmm8","zmm9","zmm10","zmm11","zmm12","zmm13","zmm14","zmm15","zmm16","zmm17","zmm18","zmm19","zmm20","zmm21","zmm22","zmm23","zmm24","zmm25","zmm26","zmm27","zmm28","zmm29","zmm30","zmm31");
  }
  return n * 24 / (Now() - t0) / 1e9;
}
double PeakFma() {  // G instr/s: 24 independent accumulators in registers
  const long n = 4000000; double t0 = Now();
  for (long k = 0; k < n; ++k) {
    __asm__ volatile("vfmadd231ps %%zmm1, %%zmm0, %%zmm8\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm9\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm10\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm11\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm12\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm13\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm14\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm15\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm16\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm17\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm18\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm19\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm20\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm21\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm22\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm23\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm24\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm25\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm26\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm27\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm28\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm29\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm30\n\t""vfmadd231ps %%zmm1, %%zmm0, %%zmm31\n\t" ::: "zmm8","zmm9","zmm10","zmm11","zmm12","zmm13","zmm14","zmm15","zmm16","zmm17","zmm18","zmm19","zmm20","zmm21","zmm22","zmm23","zmm24","zmm25","zmm26","zmm27","zmm28","zmm29","zmm30","zmm31");
  }
  return n * 24 / (Now() - t0) / 1e9;
}
double ReadBandwidth() {  // GB/s, one thread
  static std::vector<__m512i> buf(256 << 20 >> 6);
  for (auto& b : buf) b = _mm512_set1_epi32(1);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    double t0 = Now(); __m512i acc = _mm512_setzero_si512();
    for (size_t i = 0; i < buf.size(); i += 4) { acc = _mm512_add_epi32(acc, buf[i]); acc = _mm512_add_epi32(acc, buf[i+1]); acc = _mm512_add_epi32(acc, buf[i+2]); acc = _mm512_add_epi32(acc, buf[i+3]); }
    double s = Now() - t0; volatile int o = _mm512_reduce_add_epi32(acc); (void)o;
    best = std::max(best, (256 << 20) / s / 1e9);
  }
  return best;
}
int main(int argc, char** argv) {
  int rows_list[8] = {1, 16, 64, 512}; int nrows = 4;
  if (argc > 1) { nrows = 0; for (int i = 1; i < argc; ++i) rows_list[nrows++] = atoi(argv[i]); }
  double vp = 0, bp = 0; for (int i = 0; i < 5; ++i) { vp = std::max(vp, PeakVnni()); bp = std::max(bp, PeakBf16()); } const double bw = ReadBandwidth();
  double fp = 0; for (int i = 0; i < 5; ++i) fp = std::max(fp, PeakFma());
  printf("fma %.2f G/s = %.1f GMAC/s\n", fp, fp * 16);
  printf("peak one core: vpdpbusd %.2f G/s = %.1f GMAC/s; vdpbf16ps %.2f G/s = %.1f GMAC/s; read %.1f GB/s\n", vp, vp * 64, bp, bp * 32, bw);
  for (int ri = 0; ri < nrows; ++ri) {
    const int64_t rows = rows_list[ri];
    const int copies = rows <= 64 ? 30 : 2, reps = rows <= 64 ? 5 : 3;
    double t[4] = {0, 0, 0, 0}; double macs = 0, bytes8 = 0;
    for (const Shape& s : kShapes) {
      for (int w = 0; w < s.n; ++w) { macs += double(rows) * s.inner * s.outers[w]; bytes8 += double(s.inner) * s.outers[w]; }
      for (int round = 0; round < 2; ++round) {
        t[0] += bf16_seconds(rows, s.inner, s.outers, s.n, copies, reps) / 2;
        t[1] += vnni_seconds(rows, s.inner, s.outers, s.n, copies, reps) / 2;
        t[2] += i8bf16_seconds(rows, s.inner, s.outers, s.n, copies, reps) / 2;
        t[3] += vnni_digits_seconds(rows, s.inner, s.outers, s.n, copies, reps) / 2;
      }
    }
    const char* names[4] = {"bf16 panels", "vnni w8a8", "int8->bf16", "vnni digits"};
    const double bytes[4] = {2 * bytes8, bytes8, bytes8, bytes8};
    const double peak[4] = {bp * 32, vp * 64, bp * 32, vp * 32};  // digits: two VPDPBUSD a product
    for (int k = 0; k < 4; ++k) {
      if (t[k] == 0) continue;
      const double gmac = macs / t[k] / 1e9;
      const double mem_s = bytes[k] / (bw * 1e9), comp_s = macs / (peak[k] * 1e9);
      printf("rows %4ld %-12s %8.3f ms/layer  %6.1f GMAC/s  %5.1f%% of peak  roofline %.3f ms (%s)  %5.1f%% of roofline  vs bf16 %.2fx\n",
             rows, names[k], t[k] * 1e3, gmac, 100 * gmac / peak[k], 1e3 * std::max(mem_s, comp_s), mem_s > comp_s ? "mem" : "compute",
             100 * std::max(mem_s, comp_s) / t[k], t[0] / t[k]);
    }
  }
}

#pragma once
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <ctime>
// this thread's CPU seconds: preemption by other processes does not count
inline double Now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
// Sequential copy of panel_work's item order.
template <typename Problem, typename Multiply>
void RunSequential(const Problem* problems, int n, int64_t panel_width, int64_t per_item, int64_t block_rows, Multiply m) {
  int64_t first_run[5] = {};
  for (int w = 0; w < n; ++w) first_run[w + 1] = first_run[w] + (problems[w].outer / panel_width + per_item - 1) / per_item;
  const int64_t runs = first_run[n];
  const int64_t items = runs * ((problems[0].rows + block_rows - 1) / block_rows);
  for (int64_t item = 0; item < items; ++item) {
    const int64_t run = item % runs, block = item / runs;
    int w = 0;
    while (run >= first_run[w + 1]) ++w;
    const Problem& p = problems[w];
    const int64_t fr = block * block_rows, er = std::min(p.rows, fr + block_rows);
    const int64_t fp = (run - first_run[w]) * per_item, ep = std::min(p.outer / panel_width, fp + per_item);
    m(p, fr, er, fp, ep);
  }
}
template <typename T> std::vector<T> Random(size_t n) {
  std::vector<T> v(n);
  unsigned s = 12345;
  for (auto& e : v) { s = s * 1103515245u + 12345u; e = static_cast<T>((s >> 16) & 0x7f); }
  return v;
}
// median seconds per call over reps, cycling copies
template <typename Call> double Median(int reps, int copies, Call call) {
  std::vector<double> t;
  for (int i = 0; i < copies; ++i) call(i);
  for (int r = 0; r < reps; ++r) {
    double t0 = Now();
    for (int c = 0; c < copies; ++c) call(c);
    t.push_back((Now() - t0) / copies);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

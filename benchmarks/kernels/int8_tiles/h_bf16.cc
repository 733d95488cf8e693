#include PACKED_SOURCE
#include "harness.h"
extern "C" double bf16_seconds(int64_t rows, int64_t inner, const int64_t* outers, int n, int copies, int reps) {
  auto x = Random<uint16_t>(rows * inner);
  for (auto& e : x) e = 0x3f80 | (e & 0x7f);
  std::vector<std::vector<uint16_t>> panels(copies * n);
  std::vector<std::vector<float>> outs(n);
  for (int c = 0; c < copies; ++c) for (int w = 0; w < n; ++w) { panels[c * n + w] = Random<uint16_t>(outers[w] * inner); for (auto& e : panels[c*n+w]) e = 0x3f80 | (e & 0x7f); }
  for (int w = 0; w < n; ++w) outs[w].assign(rows * outers[w], 0.f);
  return Median(reps, copies, [&](int c) {
    SharedWork<Bfloat16> work;
    for (int w = 0; w < n; ++w) {
      work.problems[w] = Problem<Bfloat16>{x.data(), panels[c * n + w].data(), outs[w].data(), nullptr, rows, inner, outers[w]};
      work.first_run[w + 1] = work.first_run[w] + (outers[w] / kPanelWidth + kPanelsPerItem - 1) / kPanelsPerItem;
    }
    work.num_panel_runs = work.first_run[n];
    work.num_items = work.num_panel_runs * ((rows + kBlockRows - 1) / kBlockRows);
    WorkOn(work);
  });
}

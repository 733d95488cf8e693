#include I8BF16_SOURCE
#include "harness.h"
extern "C" double i8bf16_seconds(int64_t rows, int64_t inner, const int64_t* outers, int n, int copies, int reps) {
  auto x = Random<uint16_t>(rows * inner);
  for (auto& e : x) e = 0x3f80 | (e & 0x7f);
  std::vector<std::vector<int8_t>> panels(copies * n);
  std::vector<std::vector<float>> scales(n), outs(n);
  for (int c = 0; c < copies; ++c) for (int w = 0; w < n; ++w) panels[c * n + w] = Random<int8_t>(outers[w] * inner);
  for (int w = 0; w < n; ++w) { scales[w].assign(outers[w], 0.01f); outs[w].assign(rows * outers[w], 0.f); }
  return Median(reps, copies, [&](int c) {
    Problem probs[4];
    for (int w = 0; w < n; ++w) probs[w] = Problem{x.data(), panels[c * n + w].data(), scales[w].data(), outs[w].data(), rows, inner, outers[w]};
    RunSequential(probs, n, kPanelWidth, kPanelsPerItem, kBlockRows, MultiplyItem);
  });
}

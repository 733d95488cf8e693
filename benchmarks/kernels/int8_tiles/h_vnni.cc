#include VNNI_SOURCE
#include "harness.h"
extern "C" double vnni_seconds(int64_t rows, int64_t inner, const int64_t* outers, int n, int copies, int reps) {
  auto x = Random<uint16_t>(rows * inner);
  for (auto& e : x) e = 0x3f80 | (e & 0x7f);
  std::vector<uint16_t> outb(rows * 1536);
  std::vector<float> rs(rows, 0.01f);
  const int64_t groups = (inner + 3) / 4;
  std::vector<std::vector<int8_t>> panels(copies * n);
  std::vector<std::vector<float>> scales(n), outs(n);
  for (int c = 0; c < copies; ++c) for (int w = 0; w < n; ++w) panels[c * n + w] = Random<int8_t>(outers[w] / 16 * (groups + 1) * 64);
  for (int w = 0; w < n; ++w) { scales[w].assign(outers[w], 0.01f); outs[w].assign(rows * outers[w], 0.f); }
  return Median(reps, copies, [&](int c) {
    const uint32_t* ux = vnni_rows::QuantizeRows<false>(x.data(), rows, inner, kBlockRows, rs.data());
    Problem probs[4];
    for (int w = 0; w < n; ++w) { probs[w] = Problem{ux, rs.data(), panels[c * n + w].data(), scales[w].data(), nullptr, rows, inner, outers[w]}; probs[w].out_bfloat16 = outb.data(); }
    RunSequential(probs, n, kPanelWidth, kPanelsPerItem, kBlockRows, MultiplyItem);
  });
}

// Weight-only int8 as two int8 digits of 16-bit rows (int16_activations.py), quantized in the kernel.
extern "C" double vnni_digits_seconds(int64_t rows, int64_t inner, const int64_t* outers, int n, int copies, int reps) {
  auto x = Random<uint16_t>(rows * inner);
  for (auto& e : x) e = 0x3f80 | (e & 0x7f);
  std::vector<uint16_t> outb(rows * 1536);
  std::vector<float> rs(rows, 0.01f);
  const int64_t groups = (inner + 3) / 4;
  std::vector<std::vector<int8_t>> panels(copies * n);
  std::vector<std::vector<float>> scales(n), outs(n);
  for (int c = 0; c < copies; ++c) for (int w = 0; w < n; ++w) panels[c * n + w] = Random<int8_t>(outers[w] / 16 * (groups + 1) * 64);
  for (int w = 0; w < n; ++w) { scales[w].assign(outers[w], 0.01f); outs[w].assign(rows * outers[w], 0.f); }
  return Median(reps, copies, [&](int c) {
    const uint32_t* ux = vnni_rows::QuantizeRows<true>(x.data(), rows, inner, kBlockRows, rs.data());
    Problem probs[4];
    for (int w = 0; w < n; ++w) { probs[w] = Problem{ux, rs.data(), panels[c * n + w].data(), scales[w].data(), nullptr, 2 * rows, inner, outers[w]}; probs[w].out_bfloat16 = outb.data(); probs[w].digits = true; }
    RunSequential(probs, n, kPanelWidth, kPanelsPerItem, kBlockRows, MultiplyItem);
  });
}

// Work sharing for the int8 panel matmuls (vnni_matmul.cc, int8_bf16_matmul.cc): a call multiplies up to
// kMaxWeights weights by the same rows; each weight's panels are cut into runs of `panels_per_item` panels, the rows
// into blocks of `block_rows`, and every (run, block) pair is one item taken off one atomic counter by the caller
// and XLA's intra-op threads, so the weights of one call (q, k, v; gate, up) share the threads without a barrier
// between them.
#ifndef JAXPAGED_CPU_NATIVE_PANEL_WORK_H_
#define JAXPAGED_CPU_NATIVE_PANEL_WORK_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace panel_work {

// The item layout of one call. Problem has `rows` and `outer` (columns; a whole number of panels).
struct Layout {
  int64_t panel_width, panels_per_item, block_rows;
};

// Runs multiply(problem, first_row, end_row, first_panel, end_panel) for every item of every problem and returns
// when all are done. A helper task that starts after the call returned finds no item left: `work` outlives the
// call through the tasks' shared pointers.
template <int kMaxWeights, typename Problem, typename Multiply>
void RunPanelItems(const Problem* problems, int num_problems, Layout layout, xla::ffi::ThreadPool& pool,
                   Multiply multiply) {
  struct SharedWork {
    Problem problems[kMaxWeights];
    int64_t first_run[kMaxWeights + 1] = {};  // problem w owns runs [first_run[w], first_run[w + 1]) of each block
    int64_t num_panel_runs = 0, num_items = 0;
    Layout layout;
    Multiply multiply;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> num_done{0};
    std::mutex mutex;
    std::condition_variable all_done;
    SharedWork(Layout l, Multiply m) : layout(l), multiply(m) {}
  };
  auto work = std::make_shared<SharedWork>(layout, multiply);
  for (int w = 0; w < num_problems; ++w) {
    work->problems[w] = problems[w];
    const int64_t num_panels = problems[w].outer / layout.panel_width;
    work->first_run[w + 1] = work->first_run[w] + (num_panels + layout.panels_per_item - 1) / layout.panels_per_item;
  }
  work->num_panel_runs = work->first_run[num_problems];
  work->num_items = work->num_panel_runs * ((problems[0].rows + layout.block_rows - 1) / layout.block_rows);
  if (work->num_items == 0) return;

  auto work_on = [](SharedWork& shared) {
    const Layout& l = shared.layout;
    for (int64_t item = shared.next.fetch_add(1); item < shared.num_items; item = shared.next.fetch_add(1)) {
      const int64_t run = item % shared.num_panel_runs, block = item / shared.num_panel_runs;
      int w = 0;
      while (run >= shared.first_run[w + 1]) ++w;
      const Problem& p = shared.problems[w];
      const int64_t first_row = block * l.block_rows, end_row = std::min(p.rows, first_row + l.block_rows);
      const int64_t first_panel = (run - shared.first_run[w]) * l.panels_per_item;
      const int64_t end_panel = std::min(p.outer / l.panel_width, first_panel + l.panels_per_item);
      shared.multiply(p, first_row, end_row, first_panel, end_panel);
      if (shared.num_done.fetch_add(1) + 1 == shared.num_items) {
        std::lock_guard<std::mutex> lock(shared.mutex);
        shared.all_done.notify_all();
      }
    }
  };
  const int64_t num_helpers = std::min<int64_t>(pool.num_threads(), work->num_items - 1);
  for (int64_t i = 0; i < num_helpers; ++i) pool.Schedule([work, work_on]() { work_on(*work); });
  work_on(*work);
  std::unique_lock<std::mutex> lock(work->mutex);
  work->all_done.wait(lock, [&]() { return work->num_done.load() == work->num_items; });
}

// One weight of a call whose remaining arguments are the weights' int8 panels, then their float32 column scales,
// and whose results are one [rows, outer] per weight (float32, or the kOut a kernel names). The caller checks the
// dimensions against its own panel layout.
template <xla::ffi::DataType kOut = xla::ffi::DataType::F32>
struct WeightArgs {
  const int8_t* panels = nullptr;
  xla::ffi::Span<const int64_t> panel_dims;
  const float* scales = nullptr;
  size_t num_scales = 0;
  xla::ffi::NativeType<kOut>* out = nullptr;  // float, or uint16_t holding bfloat16 bits
  xla::ffi::Span<const int64_t> out_dims;
};

template <xla::ffi::DataType kOut>
inline xla::ffi::Error GetWeightArgs(xla::ffi::RemainingArgs& weights, xla::ffi::RemainingRets& results,
                                     int num_weights, int w, WeightArgs<kOut>& into) {
  auto panels = weights.get<xla::ffi::Buffer<xla::ffi::S8>>(w);
  auto scales = weights.get<xla::ffi::Buffer<xla::ffi::F32>>(num_weights + w);
  auto out = results.get<xla::ffi::Buffer<kOut>>(w);
  if (panels.has_error()) return panels.error();
  if (scales.has_error()) return scales.error();
  if (out.has_error()) return out.error();
  into = WeightArgs<kOut>{panels->typed_data(), panels->dimensions(), scales->typed_data(), scales->element_count(),
                          (*out)->typed_data(), (*out)->dimensions()};
  return xla::ffi::Error::Success();
}

}  // namespace panel_work

#endif  // JAXPAGED_CPU_NATIVE_PANEL_WORK_H_

// x @ W on the CPU against a weight packed once at load time, as an XLA FFI custom call.
//
// Why: XLA:CPU's dot library repacks the weight into its kernel's tile layout on every call. At a decode step's
// 64 rows that packing is a fifth of the step (the weight is read, written and read again); packed here once, the
// weight streams from memory once per call, straight into the multiply.
//
// Operands (see packed_matmul.py, which packs the weight and registers this file):
//   x         f32 [rows, inner]
//   panels    f32 [outer / 16, inner, 16]   panel p holds columns 16p .. 16p + 15 of W, one 16-float row per inner index
// Result: f32 [rows, outer] = x @ W, float32 sums.
//
// Work: tiles of 6 rows x 16 columns, each summed in 12 vector registers over the whole inner dimension (x is read
// by broadcasts, the panel row by two 8-float loads). Work items are (row block, run of panels), handed out through
// an atomic counter to the caller and to XLA's intra-op threads; a row block stays in L2 while its panels stream by.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanelWidth = 16;   // columns per panel (two 8-float vectors)
constexpr int64_t kTileRows = 6;      // rows per register tile: 6 x 2 accumulators + 2 panel vectors + 1 broadcast
// Rows per work item: a block's rows stay in L2 while its panels stream by (72 rows x 1,536 inner floats, SmolLM2's
// widest, are 432 KiB of a 1 MiB L2; much wider inner sizes spill to L3, still correct). A decode's 64 rows are one
// block, so each weight is read from memory once; a 512-row prefill reads it once per block, from L3 when it fits.
constexpr int64_t kBlockRows = 72;
// Panels per work item (64 columns): at SmolLM2's widths 3 (k, v) to 96 (gate, up) items per row block, enough to
// keep a 2-core VM's threads busy; fewer items than threads leave threads idle, never wrong.
constexpr int64_t kPanelsPerItem = 4;

typedef float Vec8 __attribute__((vector_size(32), aligned(4)));

struct Problem {
  const float* x;
  const float* panels;
  float* out;
  int64_t rows, inner, outer;
};

// One tile: kRows rows x 16 columns of the output, summed over the whole inner dimension. `upcoming` (or nullptr):
// the panel this thread multiplies next, fetched one 64-byte row per step, so that it is in cache when its turn comes
// (a decode's few rows leave too little work per panel to hide its fetch from memory otherwise).
template <int kRows, bool kPrefetch>
inline void MultiplyTile(const Problem& p, int64_t row, const float* panel, int64_t column, const float* upcoming) {
  Vec8 low[kRows], high[kRows];
  for (int r = 0; r < kRows; ++r) low[r] = high[r] = Vec8{};
  const float* x = p.x + row * p.inner;
  for (int64_t i = 0; i < p.inner; ++i) {
    if (kPrefetch) __builtin_prefetch(upcoming + i * kPanelWidth, 0, 3);
    const Vec8 w_low = *reinterpret_cast<const Vec8*>(panel + i * kPanelWidth);
    const Vec8 w_high = *reinterpret_cast<const Vec8*>(panel + i * kPanelWidth + 8);
    for (int r = 0; r < kRows; ++r) {
      const float value = x[r * p.inner + i];
      low[r] += value * w_low;
      high[r] += value * w_high;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float* out = p.out + (row + r) * p.outer + column;
    *reinterpret_cast<Vec8*>(out) = low[r];
    *reinterpret_cast<Vec8*>(out + 8) = high[r];
  }
}

template <int kRows>
inline void MultiplyTile(const Problem& p, int64_t row, const float* panel, int64_t column, const float* upcoming) {
  if (upcoming != nullptr) {
    MultiplyTile<kRows, true>(p, row, panel, column, upcoming);
  } else {
    MultiplyTile<kRows, false>(p, row, panel, column, nullptr);
  }
}

// Rows [first, end) of one panel: whole tiles, then the remainder in one smaller tile. The first tile fetches the
// `upcoming` panel (nullptr: none).
void MultiplyPanel(const Problem& p, int64_t first, int64_t end, int64_t panel_index, const float* upcoming) {
  const float* panel = p.panels + panel_index * p.inner * kPanelWidth;
  const int64_t column = panel_index * kPanelWidth;
  int64_t row = first;
  for (; row + kTileRows <= end; row += kTileRows, upcoming = nullptr) {
    MultiplyTile<kTileRows>(p, row, panel, column, upcoming);
  }
  switch (end - row) {
    case 5: MultiplyTile<5>(p, row, panel, column, upcoming); break;
    case 4: MultiplyTile<4>(p, row, panel, column, upcoming); break;
    case 3: MultiplyTile<3>(p, row, panel, column, upcoming); break;
    case 2: MultiplyTile<2>(p, row, panel, column, upcoming); break;
    case 1: MultiplyTile<1>(p, row, panel, column, upcoming); break;
    default: break;
  }
}

// The items of one call, shared with the pool's tasks: a task that starts only after the call returned finds no
// item left and touches nothing else, so the call never waits for a task to start; it waits until every item is done.
struct SharedWork {
  Problem problem;
  int64_t num_panel_runs, num_items;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> num_done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

void WorkOn(SharedWork& work) {
  const Problem& p = work.problem;
  const int64_t num_panels = p.outer / kPanelWidth;
  for (int64_t item = work.next.fetch_add(1); item < work.num_items; item = work.next.fetch_add(1)) {
    // Items run row block by row block, so the threads share a block while it is in cache.
    const int64_t block = item / work.num_panel_runs, run = item % work.num_panel_runs;
    const int64_t first_row = block * kBlockRows, end_row = std::min(p.rows, first_row + kBlockRows);
    const int64_t end_panel = std::min(num_panels, (run + 1) * kPanelsPerItem);
    for (int64_t panel = run * kPanelsPerItem; panel < end_panel; ++panel) {
      const float* upcoming = panel + 1 < end_panel ? p.panels + (panel + 1) * p.inner * kPanelWidth : nullptr;
      MultiplyPanel(p, first_row, end_row, panel, upcoming);
    }
    if (work.num_done.fetch_add(1) + 1 == work.num_items) {
      std::lock_guard<std::mutex> lock(work.mutex);
      work.all_done.notify_all();
    }
  }
}

void RunAll(const Problem& problem, ffi::ThreadPool& pool) {
  auto work = std::make_shared<SharedWork>();
  work->problem = problem;
  const int64_t num_panels = problem.outer / kPanelWidth;
  work->num_panel_runs = (num_panels + kPanelsPerItem - 1) / kPanelsPerItem;
  work->num_items = work->num_panel_runs * ((problem.rows + kBlockRows - 1) / kBlockRows);
  if (work->num_items == 0) return;
  const int64_t num_helpers = std::min<int64_t>(pool.num_threads(), work->num_items - 1);
  for (int64_t i = 0; i < num_helpers; ++i) {
    pool.Schedule([work]() { WorkOn(*work); });
  }
  WorkOn(*work);
  std::unique_lock<std::mutex> lock(work->mutex);
  work->all_done.wait(lock, [&]() { return work->num_done.load() == work->num_items; });
}

ffi::Error PackedMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> panels,
                            ffi::ResultBuffer<ffi::F32> out) {
  auto x_dims = x.dimensions();
  auto panel_dims = panels.dimensions();
  auto out_dims = out->dimensions();
  if (x_dims.size() != 2 || panel_dims.size() != 3 || panel_dims[2] != kPanelWidth) {
    return ffi::Error::InvalidArgument("packed_matmul: x must be [rows, inner], panels [outer / 16, inner, 16]");
  }
  if (panel_dims[1] != x_dims[1] || out_dims.size() != 2 || out_dims[0] != x_dims[0] ||
      out_dims[1] != panel_dims[0] * kPanelWidth) {
    return ffi::Error::InvalidArgument("packed_matmul: x, panels and the result disagree on a dimension");
  }
  RunAll(Problem{x.typed_data(), panels.typed_data(), out->typed_data(), x_dims[0], x_dims[1], out_dims[1]}, pool);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmul, PackedMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

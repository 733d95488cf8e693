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
// Work: register tiles (6 rows x 16 columns with AVX2, 12 rows x 32 columns with AVX-512; see kTileRows), each summed
// over the whole inner dimension (x is read by broadcasts, the panel rows by vector loads). Work items are (row block, run of panels), handed out through
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

constexpr int64_t kPanelWidth = 16;   // columns per panel: one 16-float row per inner index
// Rows per work item: a block's rows stay in L2 while its panels stream by (72 rows x 1,536 inner floats, SmolLM2's
// widest, are 432 KiB of a 1 MiB L2; much wider inner sizes spill to L3, still correct). A decode's 64 rows are one
// block, so each weight is read from memory once; a 512-row prefill reads it once per block, from L3 when it fits.
constexpr int64_t kBlockRows = 72;
// Panels per work item (64 columns): at SmolLM2's widths 3 (k, v) to 96 (gate, up) items per row block, enough to
// keep a 2-core VM's threads busy; fewer items than threads leave threads idle, never wrong.
constexpr int64_t kPanelsPerItem = 4;

// The register tile, by the vector width this build targets (-march=native). AVX2 (16 ymm registers): 6 rows x one
// panel, two 8-float halves per panel row: 12 accumulators, 2 weight vectors, 1 broadcast. AVX-512 (32 zmm
// registers, whose cores run 512-bit FMAs at full width on Zen 5 and Xeons): 12 rows x two panels, one 16-float
// vector per panel row: 24 accumulators, and each broadcast of x feeds two FMAs, which halves the loads per FMA
// (one panel per tile left the AVX2 code at ~0.6x XLA's dot on a Zen 5 EPYC).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr int64_t kTileRows = 12;
constexpr int kTilePanels = 2;
#else
constexpr int kLanes = 8;
constexpr int64_t kTileRows = 6;
constexpr int kTilePanels = 1;
#endif
constexpr int kVectorsPerRow = kPanelWidth / kLanes;  // vectors per panel row: 2 (AVX2) or 1 (AVX-512)
static_assert(kPanelsPerItem % kTilePanels == 0, "a work item holds whole tiles");

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

struct Problem {
  const float* x;
  const float* panels;
  float* out;
  int64_t rows, inner, outer;
};

// One tile: kRows rows x (kPanels x 16) columns of the output, from kPanels adjacent panels starting at `panel`,
// summed over the whole inner dimension. `upcoming` (or nullptr): the first of the kPanels panels this thread
// multiplies next, fetched one 64-byte row per panel per step, so that it is in cache when its turn comes (a decode's
// few rows leave too little work per panel to hide its fetch from memory otherwise).
template <int kRows, int kPanels, bool kPrefetch>
inline void MultiplyTile(const Problem& p, int64_t row, const float* panel, int64_t column, const float* upcoming) {
  constexpr int kVectors = kPanels * kVectorsPerRow;
  const int64_t panel_size = p.inner * kPanelWidth;
  Vec sums[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) sums[r][v] = Vec{};
  }
  const float* x = p.x + row * p.inner;
  for (int64_t i = 0; i < p.inner; ++i) {
    Vec weights[kVectors];
    for (int q = 0; q < kPanels; ++q) {
      if (kPrefetch) __builtin_prefetch(upcoming + q * panel_size + i * kPanelWidth, 0, 3);
      for (int h = 0; h < kVectorsPerRow; ++h) {
        weights[q * kVectorsPerRow + h] =
            *reinterpret_cast<const Vec*>(panel + q * panel_size + i * kPanelWidth + h * kLanes);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const float value = x[r * p.inner + i];
      for (int v = 0; v < kVectors; ++v) sums[r][v] += value * weights[v];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int q = 0; q < kPanels; ++q) {
      float* out = p.out + (row + r) * p.outer + column + q * kPanelWidth;
      for (int h = 0; h < kVectorsPerRow; ++h) {
        *reinterpret_cast<Vec*>(out + h * kLanes) = sums[r][q * kVectorsPerRow + h];
      }
    }
  }
}

template <int kRows, int kPanels>
inline void MultiplyTile(const Problem& p, int64_t row, const float* panel, int64_t column, const float* upcoming) {
  if (upcoming != nullptr) {
    MultiplyTile<kRows, kPanels, true>(p, row, panel, column, upcoming);
  } else {
    MultiplyTile<kRows, kPanels, false>(p, row, panel, column, nullptr);
  }
}

// A remainder of fewer than kTileRows rows, in one smaller tile.
template <int kPanels>
void MultiplyRemainder(const Problem& p, int64_t num_rows, int64_t row, const float* panel, int64_t column,
                       const float* upcoming) {
  switch (num_rows) {
#if defined(__AVX512F__)
    case 11: MultiplyTile<11, kPanels>(p, row, panel, column, upcoming); break;
    case 10: MultiplyTile<10, kPanels>(p, row, panel, column, upcoming); break;
    case 9: MultiplyTile<9, kPanels>(p, row, panel, column, upcoming); break;
    case 8: MultiplyTile<8, kPanels>(p, row, panel, column, upcoming); break;
    case 7: MultiplyTile<7, kPanels>(p, row, panel, column, upcoming); break;
    case 6: MultiplyTile<6, kPanels>(p, row, panel, column, upcoming); break;
#endif
    case 5: MultiplyTile<5, kPanels>(p, row, panel, column, upcoming); break;
    case 4: MultiplyTile<4, kPanels>(p, row, panel, column, upcoming); break;
    case 3: MultiplyTile<3, kPanels>(p, row, panel, column, upcoming); break;
    case 2: MultiplyTile<2, kPanels>(p, row, panel, column, upcoming); break;
    case 1: MultiplyTile<1, kPanels>(p, row, panel, column, upcoming); break;
    default: break;
  }
}

// Rows [first, end) of kPanels adjacent panels from `panel_index`: whole tiles, then the remainder in one smaller
// tile. The first tile fetches the `upcoming` panels (nullptr: none).
template <int kPanels>
void MultiplyPanels(const Problem& p, int64_t first, int64_t end, int64_t panel_index, const float* upcoming) {
  const float* panel = p.panels + panel_index * p.inner * kPanelWidth;
  const int64_t column = panel_index * kPanelWidth;
  int64_t row = first;
  for (; row + kTileRows <= end; row += kTileRows, upcoming = nullptr) {
    MultiplyTile<kTileRows, kPanels>(p, row, panel, column, upcoming);
  }
  MultiplyRemainder<kPanels>(p, end - row, row, panel, column, upcoming);
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
    int64_t panel = run * kPanelsPerItem;
    for (; panel + kTilePanels <= end_panel; panel += kTilePanels) {
      const bool more = panel + 2 * kTilePanels <= end_panel;
      const float* upcoming = more ? p.panels + (panel + kTilePanels) * p.inner * kPanelWidth : nullptr;
      MultiplyPanels<kTilePanels>(p, first_row, end_row, panel, upcoming);
    }
    if (panel < end_panel) MultiplyPanels<1>(p, first_row, end_row, panel, nullptr);  // an odd last panel
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

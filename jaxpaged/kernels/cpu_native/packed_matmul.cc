// x @ W on the CPU against weights packed once at load time, as XLA FFI custom calls: float32, bfloat16 where the
// CPU has AVX512-BF16, and int8 weights with float32 scales per column (weight-only int8, models/int8_weights.py).
// One call multiplies x by 1 to 4 weights (q, k and v; gate and up), one result each.
//
// Why: XLA:CPU's dot library repacks the weight into its kernel's tile layout on every call. At a decode step's
// 64 rows that packing is a fifth of the step (the weight is read, written and read again); packed here once, the
// weight streams from memory once per call, straight into the multiply.
//
// Operands, in order x, num_rows, then each weight's panels (see packed_matmul.py, which packs the weights and
// registers this file):
//   float32   x f32 [rows, inner]; panels f32 [outer / 16, inner, 16]: panel p holds columns 16p .. 16p + 15 of W,
//             one 16-float row per inner index.
//   bfloat16  x bf16 [rows, inner], inner even; panels bf16 [outer / 16, inner, 16] in shape, but each panel is
//             inner / 2 rows of 32 values, one per pair of inner indices 2i, 2i + 1, holding (W[2i, c], W[2i + 1, c])
//             for the panel's 16 columns c in turn: the operand order of VDPBF16PS, which multiplies such pairs and
//             adds both products to a float32 sum. (The float32 shape keeps the model's parameter shapes per dtype.)
//   int8      x f32 [rows, inner]; panels s8 [outer / 16, inner, 16] in the float32 order; after every weight's
//             panels, each weight's scales f32 [outer]. The int8 values are widened to float32 in registers
//             (VPMOVSXBD, VCVTDQ2PS) and summed in float32; each column's sum is multiplied by its scale once, at the
//             end. Memory reads a quarter of float32's weight bytes: what bounds a decode step where memory does.
//   num_rows  s32 []: the rows that hold real work (a step's real tokens; the rest of its bucket is padding). Only
//             rows [0, num_rows) are multiplied; the others are written as zeros. Clamped to [0, rows].
// Results, one per weight: f32 [rows, outer] = x @ W, float32 sums; the bfloat16 kernel also has a bfloat16 result
// (the sums rounded).
//
// Work: register tiles (6 rows x 16 columns with AVX2, 12 rows x 32 columns with AVX-512; see kTileRows), each summed
// over the whole inner dimension (x is read by broadcasts, the panel rows by vector loads). Work items are (row block,
// run of one weight's panels), handed out through an atomic counter to the caller and to XLA's intra-op threads; a
// row block stays in L2 while the panels of every weight of the call stream by. Every element type shares the tiling
// (packed_tiles.h); a panel row is 64 bytes in float32 and bfloat16, 16 in int8.
//
// Weights come from memory (a step's weights are far bigger than the caches), so each thread asks for the panel it
// multiplies next while it works on the current one: spread over all the current panel's tiles (one 64-byte row every
// few inner steps), into L2, and across work items (a thread claims its next item before it starts the current one).
// Asking for the whole next panel during the current panel's first tile only, as this kernel first did, asked for
// ~33 GB/s per core, more than memory gives, so every panel's first tile stalled. That and the whole-tile remainder
// below sped up a decode step's matmuls and left a 512-row prefill's unchanged (figures: docs/performance.md).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "packed_tiles.h"
#include "tile_split.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace packed_tiles;  // the register tile and the element types

// Rows per work item: a block's rows stay in L2 while its panels stream by (72 rows x 1,536 inner floats, SmolLM2's
// widest, are 432 KiB of a 1 MiB L2; much wider inner sizes spill to L3, still correct). A decode's 64 rows are one
// block, so each weight is read from memory once; a 512-row prefill reads it once per block, from L3 when it fits.
constexpr int64_t kBlockRows = 72;
// Panels per work item (64 columns): at SmolLM2's widths 3 (k, v) to 96 (gate, up) items per row block, enough to
// keep a 2-core VM's threads busy; fewer items than threads leave threads idle, never wrong.
constexpr int64_t kPanelsPerItem = 4;
// Weights of one call at most: q, k and v (or gate and up) share x, and run as one set of work items.
constexpr int kMaxWeights = 4;

static_assert(kPanelsPerItem % kTilePanels == 0, "a work item holds whole tiles");

template <typename T>
struct Problem {
  const typename T::XElement* x;
  const typename T::Element* panels;
  float* out;                            // the float32 result, or nullptr when it is rounded to bfloat16:
  uint16_t* out_bfloat16 = nullptr;      // the sums rounded to nearest even, as XLA's convert does
  int64_t rows, inner, outer;  // rows: the rows multiplied (num_rows), not the padding after them
  const float* scales = nullptr;  // int8: one per output column, multiplied into the finished sums
  // Elements per panel: inner x 16 in both layouts (inner / 2 rows of 32 bfloat16 values).
  int64_t panel_size() const { return inner * kPanelWidth; }
};

// One tile: kRows rows x (kPanels x 16) columns of the output, from kPanels adjacent panels starting at `panel`,
// summed over the whole inner dimension. `upcoming` (or nullptr): the first of the kPanels panels this thread
// multiplies next. The tiles of a panel share asking for it: tile `phase` of `stride` asks for rows phase,
// phase + stride, ... of each upcoming panel (one 64-byte row every `stride` inner steps), into L2.
template <typename T, int kRows, int kPanels, bool kPrefetch>
inline void MultiplyTile(const Problem<T>& p, int64_t row, const typename T::Element* panel, int64_t column,
                         const typename T::Element* upcoming, int64_t phase, int64_t stride) {
  constexpr int kVectors = kPanels * T::kVectorsPerRow;
  const int64_t panel_size = p.panel_size();
  Vec sums[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) sums[r][v] = Vec{};
  }
  const typename T::XElement* x = p.x + row * p.inner;
  int64_t steps_to_prefetch = phase + 1;  // a counter, not i % stride: no division in the inner loop
  // Inner step i starts panel row i / kInnerStep, kPanelWidth * kInnerStep elements (64 bytes) each.
  for (int64_t i = 0; i < p.inner; i += T::kInnerStep) {
    if (kPrefetch && --steps_to_prefetch == 0) {
      steps_to_prefetch = stride;
      for (int q = 0; q < kPanels; ++q) __builtin_prefetch(upcoming + q * panel_size + i * kPanelWidth, 0, 2);
    }
    typename T::Weight weights[kVectors];
    for (int q = 0; q < kPanels; ++q) {
      for (int h = 0; h < T::kVectorsPerRow; ++h) {
        weights[q * T::kVectorsPerRow + h] = T::Load(panel + q * panel_size + i * kPanelWidth + h * kLanes);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const auto value = T::BroadcastSource(x + r * p.inner + i);
      for (int v = 0; v < kVectors; ++v) T::Accumulate(sums[r][v], value, weights[v]);
    }
  }
  if constexpr (T::kScaled) {
    for (int v = 0; v < kVectors; ++v) {
      const Vec scale = *reinterpret_cast<const Vec*>(p.scales + column + v * kLanes);
      for (int r = 0; r < kRows; ++r) sums[r][v] *= scale;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const int64_t at = (row + r) * p.outer + column;
    if (p.out != nullptr) {
      for (int v = 0; v < kVectors; ++v) *reinterpret_cast<Vec*>(p.out + at + v * kLanes) = sums[r][v];
    } else {
      for (int v = 0; v < kVectors; ++v) StoreBfloat16(p.out_bfloat16 + at + v * kLanes, sums[r][v]);
    }
  }
}

template <typename T, int kRows, int kPanels>
inline void MultiplyTile(const Problem<T>& p, int64_t row, const typename T::Element* panel, int64_t column,
                         const typename T::Element* upcoming, int64_t phase, int64_t stride) {
  if (upcoming != nullptr) {
    MultiplyTile<T, kRows, kPanels, true>(p, row, panel, column, upcoming, phase, stride);
  } else {
    MultiplyTile<T, kRows, kPanels, false>(p, row, panel, column, nullptr, 0, 1);
  }
}

// One tile of num_rows rows (1 to kTileRows), each size its own instance of the register tile.
template <typename T, int kPanels>
void MultiplyRows(const Problem<T>& p, int64_t num_rows, int64_t row, const typename T::Element* panel,
                  int64_t column, const typename T::Element* upcoming, int64_t phase, int64_t stride) {
  switch (num_rows) {
#if defined(__AVX512F__)
    case 12: MultiplyTile<T, 12, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 11: MultiplyTile<T, 11, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 10: MultiplyTile<T, 10, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 9: MultiplyTile<T, 9, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 8: MultiplyTile<T, 8, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 7: MultiplyTile<T, 7, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
#endif
    case 6: MultiplyTile<T, 6, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 5: MultiplyTile<T, 5, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 4: MultiplyTile<T, 4, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 3: MultiplyTile<T, 3, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 2: MultiplyTile<T, 2, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    case 1: MultiplyTile<T, 1, kPanels>(p, row, panel, column, upcoming, phase, stride); break;
    default: break;
  }
}

// Rows [first, end) of kPanels adjacent panels from `panel_index`, in the tiles tile_split.h cuts them into; the tiles
// share fetching the `upcoming` panels (nullptr: none).
template <typename T, int kPanels>
void MultiplyPanelsAt(const Problem<T>& p, int64_t first, int64_t end, const typename T::Element* panel,
                      int64_t column, const typename T::Element* upcoming) {
  tile_split::ForEachTile(first, end, kTileRows, [&](int64_t row, int64_t num_rows, int64_t tile, int64_t num_tiles) {
    MultiplyRows<T, kPanels>(p, num_rows, row, panel, column, upcoming, tile, num_tiles);
  });
}

// Float32 tiles over int8 panels widened ahead of time (below), with Int8's column scales.
struct WidenedInt8 : Float32 {
  static constexpr bool kScaled = true;
};

// int8 rows [first, end) of kPanels adjacent panels. More than one tile's rows: the panels are widened to float32
// once, into a per-thread buffer that stays in L2 (2 panels x 1,536 inner x 16 floats: 192 KiB at SmolLM2's widest),
// and every tile of the block runs the float32 tile over it. Widening inside each tile repeated it once per tile,
// 6 times for a 64-row decode block, and the widening instructions share the FMA ports: a whole step's matmuls ran
// at 0.66x float32's at 512 rows that way, 1.01x and 1.47x in two runs this way (2-core Xeon with AVX-512, loaded,
// 2026-12-05; benchmarks/quantization/int8_matmul.py). Memory still delivers int8 bytes: the widening reads each
// panel once, and asks for the `upcoming` int8 panels as it goes.
template <int kPanels>
void MultiplyInt8Panels(const Problem<Int8>& p, int64_t first, int64_t end, int64_t panel_index,
                        const int8_t* upcoming) {
  const int8_t* panel = p.panels + panel_index * p.panel_size();
  const int64_t column = panel_index * kPanelWidth;
  if (end - first <= kTileRows) {  // one tile: widening in registers reads each panel row once already
    MultiplyPanelsAt<Int8, kPanels>(p, first, end, panel, column, upcoming);
    return;
  }
  thread_local std::vector<float> widened;
  const int64_t size = kPanels * p.panel_size();  // adjacent panels are adjacent in memory
  if (static_cast<int64_t>(widened.size()) < size) widened.resize(size);
  for (int64_t e = 0; e < size; e += kLanes) {
    if (upcoming != nullptr && e % 64 == 0) __builtin_prefetch(upcoming + e, 0, 2);
    *reinterpret_cast<Vec*>(widened.data() + e) = Int8::Load(panel + e);
  }
  const Problem<WidenedInt8> as_float{p.x, widened.data(), p.out, p.out_bfloat16, p.rows, p.inner, p.outer,
                                      p.scales};
  MultiplyPanelsAt<WidenedInt8, kPanels>(as_float, first, end, widened.data(), column, nullptr);
}

template <typename T, int kPanels>
void MultiplyPanels(const Problem<T>& p, int64_t first, int64_t end, int64_t panel_index,
                    const typename T::Element* upcoming) {
  if constexpr (std::is_same_v<T, Int8>) {
    MultiplyInt8Panels<kPanels>(p, first, end, panel_index, upcoming);
  } else {
    MultiplyPanelsAt<T, kPanels>(p, first, end, p.panels + panel_index * p.panel_size(), panel_index * kPanelWidth,
                                 upcoming);
  }
}

// The items of one call, shared with the pool's tasks: a task that starts only after the call returned finds no
// item left and touches nothing else, so the call never waits for a task to start; it waits until every item is done.
template <typename T>
struct SharedWork {
  Problem<T> problems[kMaxWeights];  // one per weight, all on the same x and rows
  int64_t first_run[kMaxWeights + 1] = {};  // problem w owns runs [first_run[w], first_run[w + 1]) of each row block
  int64_t num_panel_runs = 0, num_items = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> num_done{0};
  std::mutex mutex;
  std::condition_variable all_done;

  // Item `item` as (its problem, its row block, its run of that problem's panels).
  int ProblemOf(int64_t item) const {
    const int64_t run = item % num_panel_runs;
    int w = 0;
    while (run >= first_run[w + 1]) ++w;
    return w;
  }
  int64_t LocalRun(int64_t item, int w) const { return item % num_panel_runs - first_run[w]; }
  const typename T::Element* FirstPanel(int64_t item) const {
    const int w = ProblemOf(item);
    return problems[w].panels + LocalRun(item, w) * kPanelsPerItem * problems[w].panel_size();
  }
};

template <typename T>
void WorkOn(SharedWork<T>& work) {
  // Each thread claims its next item before working on the current one, so the current item's last panel can fetch
  // the next item's first.
  int64_t item = work.next.fetch_add(1);
  while (item < work.num_items) {
    const int64_t following = work.next.fetch_add(1);
    const typename T::Element* following_first = following < work.num_items ? work.FirstPanel(following) : nullptr;
    // Items run row block by row block, so the threads share a block while it is in cache (the weights of a fused
    // call, e.g. q, k and v, one after the other in a block).
    const int w = work.ProblemOf(item);
    const Problem<T>& p = work.problems[w];
    const int64_t num_panels = p.outer / kPanelWidth;
    const int64_t block = item / work.num_panel_runs, run = work.LocalRun(item, w);
    const int64_t first_row = block * kBlockRows, end_row = std::min(p.rows, first_row + kBlockRows);
    const int64_t end_panel = std::min(num_panels, (run + 1) * kPanelsPerItem);
    int64_t panel = run * kPanelsPerItem;
    for (; panel + kTilePanels <= end_panel; panel += kTilePanels) {
      // The item's next panels, else the following item's first (a prefetch past the panels' end is harmless).
      const typename T::Element* upcoming =
          panel + kTilePanels < end_panel ? p.panels + (panel + kTilePanels) * p.panel_size() : following_first;
      MultiplyPanels<T, kTilePanels>(p, first_row, end_row, panel, upcoming);
    }
    if (panel < end_panel) MultiplyPanels<T, 1>(p, first_row, end_row, panel, following_first);  // an odd last panel
    if (work.num_done.fetch_add(1) + 1 == work.num_items) {
      std::lock_guard<std::mutex> lock(work.mutex);
      work.all_done.notify_all();
    }
    item = following;
  }
}

// Every problem's items (problem i's runs follow problem i - 1's in each row block), on the caller and on XLA's
// intra-op threads.
template <typename T>
void RunAll(const Problem<T>* problems, int num_problems, ffi::ThreadPool& pool) {
  auto work = std::make_shared<SharedWork<T>>();
  for (int w = 0; w < num_problems; ++w) {
    work->problems[w] = problems[w];
    const int64_t num_panels = problems[w].outer / kPanelWidth;
    work->first_run[w + 1] = work->first_run[w] + (num_panels + kPanelsPerItem - 1) / kPanelsPerItem;
  }
  work->num_panel_runs = work->first_run[num_problems];
  const int64_t rows = problems[0].rows;
  work->num_items = work->num_panel_runs * ((rows + kBlockRows - 1) / kBlockRows);
  if (work->num_items == 0) return;
  const int64_t num_helpers = std::min<int64_t>(pool.num_threads(), work->num_items - 1);
  for (int64_t i = 0; i < num_helpers; ++i) {
    pool.Schedule([work]() { WorkOn(*work); });
  }
  WorkOn(*work);
  std::unique_lock<std::mutex> lock(work->mutex);
  work->all_done.wait(lock, [&]() { return work->num_done.load() == work->num_items; });
}

// Checks the operands' shapes and runs x times each weight into its float32 or bfloat16 result: each handler below is
// one instance of it. Operands: x, num_rows, then the weights' panels; results: one per weight, in order.
// kType: x's element type; kWeightType: the panels' (int8 panels are followed by one f32 scale vector per weight).
template <typename T, ffi::DataType kType, ffi::DataType kOutType, ffi::DataType kWeightType = kType>
ffi::Error Run(ffi::ThreadPool pool, ffi::Buffer<kType> x, ffi::Buffer<ffi::S32> num_rows, ffi::RemainingArgs weights,
               ffi::RemainingRets results) {
  auto x_dims = x.dimensions();
  if (x_dims.size() != 2 || x_dims[1] % T::kInnerStep) {
    return ffi::Error::InvalidArgument("packed_matmul: x must be [rows, inner] (bfloat16: inner even)");
  }
  if (num_rows.element_count() != 1) {
    return ffi::Error::InvalidArgument("packed_matmul: num_rows must be one int32");
  }
  const int num_weights = static_cast<int>(weights.size()) / (T::kScaled ? 2 : 1);
  if (num_weights < 1 || num_weights > kMaxWeights || static_cast<int>(results.size()) != num_weights ||
      (T::kScaled && weights.size() % 2)) {
    return ffi::Error::InvalidArgument("packed_matmul: 1 to 4 weights (int8: each with its scales), one result each");
  }
  const int64_t all_rows = x_dims[0];
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, all_rows);
  Problem<T> problems[kMaxWeights];
  for (int w = 0; w < num_weights; ++w) {
    auto panels = weights.get<ffi::Buffer<kWeightType>>(w);
    auto out = results.get<ffi::Buffer<kOutType>>(w);
    if (panels.has_error()) return panels.error();
    if (out.has_error()) return out.error();
    auto panel_dims = panels->dimensions();
    auto out_dims = (*out)->dimensions();
    if (panel_dims.size() != 3 || panel_dims[2] != kPanelWidth || panel_dims[1] != x_dims[1] ||
        out_dims.size() != 2 || out_dims[0] != all_rows || out_dims[1] != panel_dims[0] * kPanelWidth) {
      return ffi::Error::InvalidArgument("packed_matmul: panels must be [outer / 16, inner, 16] and results "
                                         "[rows, outer], agreeing with x [rows, inner]");
    }
    const int64_t outer = out_dims[1];
    problems[w] = Problem<T>{x.typed_data(), panels->typed_data(), nullptr, nullptr, rows, x_dims[1], outer};
    if constexpr (T::kScaled) {
      auto scales = weights.get<ffi::Buffer<ffi::F32>>(num_weights + w);
      if (scales.has_error()) return scales.error();
      if (scales->element_count() != static_cast<size_t>(outer)) {
        return ffi::Error::InvalidArgument("packed_matmul: int8 scales must be [outer], one per column");
      }
      problems[w].scales = scales->typed_data();
    }
    // The padding rows' results are zeros: finite, whatever runs on them next.
    if constexpr (kOutType == ffi::DataType::F32) {
      problems[w].out = (*out)->typed_data();
      std::fill(problems[w].out + rows * outer, problems[w].out + all_rows * outer, 0.0f);
    } else {
      problems[w].out_bfloat16 = (*out)->typed_data();
      std::fill(problems[w].out_bfloat16 + rows * outer, problems[w].out_bfloat16 + all_rows * outer,
                uint16_t{0});  // bfloat16 +0
    }
  }
  RunAll(problems, num_weights, pool);
  return ffi::Error::Success();
}

constexpr auto PackedMatmulImpl = Run<Float32, ffi::DataType::F32, ffi::DataType::F32>;
constexpr auto PackedMatmulInt8Impl = Run<Int8, ffi::DataType::F32, ffi::DataType::F32, ffi::DataType::S8>;
#if defined(__AVX512BF16__)
constexpr auto PackedMatmulBfloat16Impl = Run<Bfloat16, ffi::DataType::BF16, ffi::DataType::F32>;
// The layers' matmuls want bfloat16 results: rounded here, the float32 result never goes through memory (at a
// 512-row prefill that round trip is tens of MB a step).
constexpr auto PackedMatmulBfloat16OutImpl = Run<Bfloat16, ffi::DataType::BF16, ffi::DataType::BF16>;
#endif

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmul, PackedMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmulInt8, PackedMatmulInt8Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());

// Only where the build targets AVX512-BF16: packed_matmul.py registers it when the library exports it.
#if defined(__AVX512BF16__)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmulBfloat16, PackedMatmulBfloat16Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmulBfloat16Out, PackedMatmulBfloat16OutImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
#endif

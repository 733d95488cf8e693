// x @ W on the CPU against a weight packed once at load time, as XLA FFI custom calls: float32, and bfloat16 where
// the CPU has AVX512-BF16.
//
// Why: XLA:CPU's dot library repacks the weight into its kernel's tile layout on every call. At a decode step's
// 64 rows that packing is a fifth of the step (the weight is read, written and read again); packed here once, the
// weight streams from memory once per call, straight into the multiply.
//
// Operands (see packed_matmul.py, which packs the weight and registers this file):
//   float32   x f32 [rows, inner]; panels f32 [outer / 16, inner, 16]: panel p holds columns 16p .. 16p + 15 of W,
//             one 16-float row per inner index.
//   bfloat16  x bf16 [rows, inner], inner even; panels bf16 [outer / 16, inner, 16] in shape, but each panel is
//             inner / 2 rows of 32 values, one per pair of inner indices 2i, 2i + 1, holding (W[2i, c], W[2i + 1, c])
//             for the panel's 16 columns c in turn: the operand order of VDPBF16PS, which multiplies such pairs and
//             adds both products to a float32 sum. (The float32 shape keeps the model's parameter shapes per dtype.)
// Result: f32 [rows, outer] = x @ W, float32 sums; the bfloat16 kernel also has a bfloat16 result (the sums rounded).
//
// Work: register tiles (6 rows x 16 columns with AVX2, 12 rows x 32 columns with AVX-512; see kTileRows), each summed
// over the whole inner dimension (x is read by broadcasts, the panel rows by vector loads). Work items are (row block,
// run of panels), handed out through an atomic counter to the caller and to XLA's intra-op threads; a row block stays
// in L2 while its panels stream by. Both element types share the tiling; a panel row is 64 bytes in both.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanelWidth = 16;  // columns per panel
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
static_assert(kPanelsPerItem % kTilePanels == 0, "a work item holds whole tiles");

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

// float32: a panel row is kPanelWidth / kLanes vectors of 16 columns' weights for one inner index; each is multiplied
// by the broadcast x[r, i] and added.
struct Float32 {
  using Element = float;
  static constexpr int kInnerStep = 1;                        // inner indices per panel row
  static constexpr int kVectorsPerRow = kPanelWidth / kLanes;  // 2 (AVX2) or 1 (AVX-512)
  using Weight = Vec;
  static Weight Load(const Element* at) { return *reinterpret_cast<const Vec*>(at); }
  static Element BroadcastSource(const Element* x) { return *x; }
  static void Accumulate(Vec& sum, Element x, const Weight& weight) { sum += x * weight; }
};

#if defined(__AVX512BF16__)
// bfloat16: a panel row is one vector of 16 (W[2i, c], W[2i + 1, c]) pairs; the pair (x[r, 2i], x[r, 2i + 1]) is
// broadcast as one 32-bit value and VDPBF16PS adds x[r, 2i] W[2i, c] + x[r, 2i + 1] W[2i + 1, c] to column c's sum.
struct Bfloat16 {
  using Element = uint16_t;  // bfloat16 bits, as XLA's FFI hands them over
  static constexpr int kInnerStep = 2;
  static constexpr int kVectorsPerRow = 1;
  using Weight = __m512bh;
  static Weight Load(const Element* at) { return (__m512bh)_mm512_loadu_si512(at); }
  static int32_t BroadcastSource(const Element* x) {
    int32_t pair;
    std::memcpy(&pair, x, sizeof(pair));
    return pair;
  }
  static void Accumulate(Vec& sum, int32_t pair, const Weight& weight) {
    sum = (Vec)_mm512_dpbf16_ps((__m512)sum, (__m512bh)_mm512_set1_epi32(pair), weight);
  }
};
#endif

// A tile's float32 sums written as bfloat16: only the bfloat16 kernel asks for that, built only with AVX512-BF16.
inline void StoreBfloat16(uint16_t* out, const Vec& sums) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh((__m512)sums));
#else
  (void)out;
  (void)sums;
  __builtin_unreachable();
#endif
}

template <typename T>
struct Problem {
  const typename T::Element* x;
  const typename T::Element* panels;
  float* out;                            // the float32 result, or nullptr when it is rounded to bfloat16:
  uint16_t* out_bfloat16 = nullptr;      // the sums rounded to nearest even, as XLA's convert does
  int64_t rows, inner, outer;
  // Elements per panel: inner x 16 in both layouts (inner / 2 rows of 32 bfloat16 values).
  int64_t panel_size() const { return inner * kPanelWidth; }
};

// One tile: kRows rows x (kPanels x 16) columns of the output, from kPanels adjacent panels starting at `panel`,
// summed over the whole inner dimension. `upcoming` (or nullptr): the first of the kPanels panels this thread
// multiplies next, fetched one 64-byte row per panel per step, so that it is in cache when its turn comes (a decode's
// few rows leave too little work per panel to hide its fetch from memory otherwise).
template <typename T, int kRows, int kPanels, bool kPrefetch>
inline void MultiplyTile(const Problem<T>& p, int64_t row, const typename T::Element* panel, int64_t column,
                         const typename T::Element* upcoming) {
  constexpr int kVectors = kPanels * T::kVectorsPerRow;
  const int64_t panel_size = p.panel_size();
  Vec sums[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) sums[r][v] = Vec{};
  }
  const typename T::Element* x = p.x + row * p.inner;
  // Inner step i starts panel row i / kInnerStep, kPanelWidth * kInnerStep elements (64 bytes) each.
  for (int64_t i = 0; i < p.inner; i += T::kInnerStep) {
    typename T::Weight weights[kVectors];
    for (int q = 0; q < kPanels; ++q) {
      if (kPrefetch) __builtin_prefetch(upcoming + q * panel_size + i * kPanelWidth, 0, 3);
      for (int h = 0; h < T::kVectorsPerRow; ++h) {
        weights[q * T::kVectorsPerRow + h] = T::Load(panel + q * panel_size + i * kPanelWidth + h * kLanes);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const auto value = T::BroadcastSource(x + r * p.inner + i);
      for (int v = 0; v < kVectors; ++v) T::Accumulate(sums[r][v], value, weights[v]);
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
                         const typename T::Element* upcoming) {
  if (upcoming != nullptr) {
    MultiplyTile<T, kRows, kPanels, true>(p, row, panel, column, upcoming);
  } else {
    MultiplyTile<T, kRows, kPanels, false>(p, row, panel, column, nullptr);
  }
}

// A remainder of fewer than kTileRows rows, in one smaller tile.
template <typename T, int kPanels>
void MultiplyRemainder(const Problem<T>& p, int64_t num_rows, int64_t row, const typename T::Element* panel,
                       int64_t column, const typename T::Element* upcoming) {
  switch (num_rows) {
#if defined(__AVX512F__)
    case 11: MultiplyTile<T, 11, kPanels>(p, row, panel, column, upcoming); break;
    case 10: MultiplyTile<T, 10, kPanels>(p, row, panel, column, upcoming); break;
    case 9: MultiplyTile<T, 9, kPanels>(p, row, panel, column, upcoming); break;
    case 8: MultiplyTile<T, 8, kPanels>(p, row, panel, column, upcoming); break;
    case 7: MultiplyTile<T, 7, kPanels>(p, row, panel, column, upcoming); break;
    case 6: MultiplyTile<T, 6, kPanels>(p, row, panel, column, upcoming); break;
#endif
    case 5: MultiplyTile<T, 5, kPanels>(p, row, panel, column, upcoming); break;
    case 4: MultiplyTile<T, 4, kPanels>(p, row, panel, column, upcoming); break;
    case 3: MultiplyTile<T, 3, kPanels>(p, row, panel, column, upcoming); break;
    case 2: MultiplyTile<T, 2, kPanels>(p, row, panel, column, upcoming); break;
    case 1: MultiplyTile<T, 1, kPanels>(p, row, panel, column, upcoming); break;
    default: break;
  }
}

// Rows [first, end) of kPanels adjacent panels from `panel_index`: whole tiles, then the remainder in one smaller
// tile. The first tile fetches the `upcoming` panels (nullptr: none).
template <typename T, int kPanels>
void MultiplyPanels(const Problem<T>& p, int64_t first, int64_t end, int64_t panel_index,
                    const typename T::Element* upcoming) {
  const typename T::Element* panel = p.panels + panel_index * p.panel_size();
  const int64_t column = panel_index * kPanelWidth;
  int64_t row = first;
  for (; row + kTileRows <= end; row += kTileRows, upcoming = nullptr) {
    MultiplyTile<T, kTileRows, kPanels>(p, row, panel, column, upcoming);
  }
  MultiplyRemainder<T, kPanels>(p, end - row, row, panel, column, upcoming);
}

// The items of one call, shared with the pool's tasks: a task that starts only after the call returned finds no
// item left and touches nothing else, so the call never waits for a task to start; it waits until every item is done.
template <typename T>
struct SharedWork {
  Problem<T> problem;
  int64_t num_panel_runs, num_items;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> num_done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

template <typename T>
void WorkOn(SharedWork<T>& work) {
  const Problem<T>& p = work.problem;
  const int64_t num_panels = p.outer / kPanelWidth;
  for (int64_t item = work.next.fetch_add(1); item < work.num_items; item = work.next.fetch_add(1)) {
    // Items run row block by row block, so the threads share a block while it is in cache.
    const int64_t block = item / work.num_panel_runs, run = item % work.num_panel_runs;
    const int64_t first_row = block * kBlockRows, end_row = std::min(p.rows, first_row + kBlockRows);
    const int64_t end_panel = std::min(num_panels, (run + 1) * kPanelsPerItem);
    int64_t panel = run * kPanelsPerItem;
    for (; panel + kTilePanels <= end_panel; panel += kTilePanels) {
      const bool more = panel + 2 * kTilePanels <= end_panel;
      const typename T::Element* upcoming = more ? p.panels + (panel + kTilePanels) * p.panel_size() : nullptr;
      MultiplyPanels<T, kTilePanels>(p, first_row, end_row, panel, upcoming);
    }
    if (panel < end_panel) MultiplyPanels<T, 1>(p, first_row, end_row, panel, nullptr);  // an odd last panel
    if (work.num_done.fetch_add(1) + 1 == work.num_items) {
      std::lock_guard<std::mutex> lock(work.mutex);
      work.all_done.notify_all();
    }
  }
}

template <typename T>
void RunAll(const Problem<T>& problem, ffi::ThreadPool& pool) {
  auto work = std::make_shared<SharedWork<T>>();
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

// Checks the operands' shapes and runs the product into a float32 or bfloat16 result: each handler below is one
// instance of it.
template <typename T, ffi::DataType kType, ffi::DataType kOutType>
ffi::Error Run(ffi::ThreadPool pool, ffi::Buffer<kType> x, ffi::Buffer<kType> panels, ffi::ResultBuffer<kOutType> out) {
  auto x_dims = x.dimensions();
  auto panel_dims = panels.dimensions();
  auto out_dims = out->dimensions();
  if (x_dims.size() != 2 || panel_dims.size() != 3 || panel_dims[2] != kPanelWidth || x_dims[1] % T::kInnerStep) {
    return ffi::Error::InvalidArgument("packed_matmul: x must be [rows, inner], panels [outer / 16, inner, 16] "
                                       "(bfloat16: inner even)");
  }
  if (panel_dims[1] != x_dims[1] || out_dims.size() != 2 || out_dims[0] != x_dims[0] ||
      out_dims[1] != panel_dims[0] * kPanelWidth) {
    return ffi::Error::InvalidArgument("packed_matmul: x, panels and the result disagree on a dimension");
  }
  Problem<T> problem{x.typed_data(), panels.typed_data(), nullptr, nullptr, x_dims[0], x_dims[1], out_dims[1]};
  if constexpr (kOutType == ffi::DataType::F32) {
    problem.out = out->typed_data();
  } else {
    problem.out_bfloat16 = out->typed_data();
  }
  RunAll(problem, pool);
  return ffi::Error::Success();
}

constexpr auto PackedMatmulImpl = Run<Float32, ffi::DataType::F32, ffi::DataType::F32>;
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
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// Only where the build targets AVX512-BF16: packed_matmul.py registers it when the library exports it.
#if defined(__AVX512BF16__)
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmulBfloat16, PackedMatmulBfloat16Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPackedMatmulBfloat16Out, PackedMatmulBfloat16OutImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::BF16>>());
#endif

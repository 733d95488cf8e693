// Weight-only int8 on the CPU's bfloat16 pair dot VDPBF16PS (AVX512-BF16), as an XLA FFI custom call: float
// activation rows rounded to bfloat16, times int8 weights packed once at load and widened to bfloat16 (exactly: an
// integer of at most 7 significant bits), float32 sums, each column's scale applied once at the end. One call
// multiplies x by 1 to 4 weights (q, k and v; gate and up), one result each.
//
// Why: a W1 step (64 decode rows, 256-512 prefill rows) is bound by multiply-adds, not by reading weights, so int8
// weights widened to float32 (packed_matmul.cc's int8 panels) run at float32's FMA rate and gain nothing. VDPBF16PS
// does 32 multiply-adds per 512-bit instruction, twice a float32 FMA's, at the same issue rate on Zen 4 and Xeons;
// the weights still cross memory as int8 bytes.
//
// Operands, in order (int8_bf16_matmul.py packs the weights and registers this file):
//   x          bf16 [rows, inner], inner even: the rows, rounded to bfloat16 (the caller pads an odd inner size).
//   num_rows   s32 []: rows [0, num_rows) hold real work; the others are written as zeros. Clamped to [0, rows].
//   panels     s8 [outer / 16, inner, 16] per weight: panel p holds columns 16p .. 16p + 15 as inner / 2 rows of 32
//              bytes, row i holding (W[2i, c], W[2i + 1, c]) for each of its 16 columns c in turn: VDPBF16PS's
//              operand order once widened (the order packed_matmul.cc's bfloat16 panels have).
//   scales     f32 [outer] per weight, after every weight's panels.
// Results, one per weight: f32 [rows, outer] = (sum_k bf16(x[r, k]) W[k, c]) * scale[c], float32 sums.
//
// Work: as vnni_matmul.cc, items (row block of up to 72 rows, run of 4 panels of one weight) handed out through an
// atomic counter to the caller and XLA's intra-op threads. A block of more than one register tile (12 rows x 2
// panels) widens its two panels once into a per-thread bfloat16 buffer (2 x 1,536 x 16 x 2 bytes = 96 KiB at
// SmolLM2's widest inner size, in L2) that every tile of the block reads; a block of one tile (a decode of a few
// rows) widens in registers as it goes, each panel row read once either way.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "panel_work.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanelWidth = 16;  // columns per panel
constexpr int64_t kPairRow = 32;     // elements of one panel row: 16 columns x 2 inner values
constexpr int64_t kBlockRows = 72;   // rows per work item: their bfloat16 rows stay in L2 while the panels stream by
constexpr int64_t kPanelsPerItem = 4;
constexpr int64_t kTileRows = 12;    // 12 rows x 2 panels: 24 zmm sums, 2 weight vectors, 1 broadcast
constexpr int kTilePanels = 2;
constexpr int kMaxWeights = 4;

struct Problem {
  const uint16_t* x;  // bfloat16 bits
  const int8_t* panels;
  const float* scales;
  float* out;
  int64_t rows, inner, outer;  // rows: the rows multiplied (num_rows), not the padding after them
  int64_t panel_size() const { return inner * kPanelWidth; }
};

// One panel row's 32 int8 weights as 32 bfloat16 values, exact: elements 0-15 from bytes 0-15, 16-31 from 16-31.
inline __m512bh Widen(const int8_t* at) {
  const __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
  const __m512 high =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at + 16))));
  return _mm512_cvtne2ps_pbh(high, low);  // the second operand fills the low half
}

// Where a tile reads its panel rows: kDirect, the int8 panels, widened in registers; else the widened bfloat16 copy.
template <bool kDirect>
struct PanelRows {
  const void* first;   // the tile's first panel (int8 or bfloat16)
  int64_t panel_size;  // elements per panel
  __m512bh Load(int q, int64_t pair) const {
    if constexpr (kDirect) {
      return Widen(static_cast<const int8_t*>(first) + q * panel_size + pair * kPairRow);
    } else {
      const uint16_t* at = static_cast<const uint16_t*>(first) + q * panel_size + pair * kPairRow;
      return (__m512bh)_mm512_loadu_si512(at);
    }
  }
};

// kRows rows x kPanels adjacent panels (from `panel_index`) of the output, summed over the whole inner dimension.
template <int kRows, int kPanels, bool kDirect>
void MultiplyTile(const Problem& p, int64_t row, int64_t panel_index, const PanelRows<kDirect>& panels) {
  __m512 sums[kRows][kPanels];
  for (int r = 0; r < kRows; ++r) {
    for (int q = 0; q < kPanels; ++q) sums[r][q] = _mm512_setzero_ps();
  }
  const uint16_t* x = p.x + row * p.inner;
  const int64_t pairs = p.inner / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    __m512bh weights[kPanels];
    for (int q = 0; q < kPanels; ++q) weights[q] = panels.Load(q, i);
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * p.inner + 2 * i, sizeof(pair));
      const __m512bh value = (__m512bh)_mm512_set1_epi32(pair);
      for (int q = 0; q < kPanels; ++q) sums[r][q] = _mm512_dpbf16_ps(sums[r][q], value, weights[q]);
    }
  }
  for (int q = 0; q < kPanels; ++q) {
    const int64_t column = (panel_index + q) * kPanelWidth;
    const __m512 scale = _mm512_loadu_ps(p.scales + column);
    for (int r = 0; r < kRows; ++r) _mm512_storeu_ps(p.out + (row + r) * p.outer + column, sums[r][q] * scale);
  }
}

// A block of at most one tile's rows, widening in registers.
template <int kPanels>
void MultiplyFewRows(const Problem& p, int64_t num_rows, int64_t row, int64_t panel_index) {
  const PanelRows<true> panels{p.panels + panel_index * p.panel_size(), p.panel_size()};
  switch (num_rows) {
    case 12: MultiplyTile<12, kPanels>(p, row, panel_index, panels); break;
    case 11: MultiplyTile<11, kPanels>(p, row, panel_index, panels); break;
    case 10: MultiplyTile<10, kPanels>(p, row, panel_index, panels); break;
    case 9: MultiplyTile<9, kPanels>(p, row, panel_index, panels); break;
    case 8: MultiplyTile<8, kPanels>(p, row, panel_index, panels); break;
    case 7: MultiplyTile<7, kPanels>(p, row, panel_index, panels); break;
    case 6: MultiplyTile<6, kPanels>(p, row, panel_index, panels); break;
    case 5: MultiplyTile<5, kPanels>(p, row, panel_index, panels); break;
    case 4: MultiplyTile<4, kPanels>(p, row, panel_index, panels); break;
    case 3: MultiplyTile<3, kPanels>(p, row, panel_index, panels); break;
    case 2: MultiplyTile<2, kPanels>(p, row, panel_index, panels); break;
    case 1: MultiplyTile<1, kPanels>(p, row, panel_index, panels); break;
    default: break;
  }
}

// Rows [first, end) of kPanels panels from `panel_index`. More than a tile's rows: the panels are widened once into
// this thread's buffer, then whole tiles run over it; the rows after the last whole tile are covered by one more
// whole tile ending at `end`, overlapping the one before (its rows get the same sums twice), as packed_matmul.cc does.
template <int kPanels>
void MultiplyPanels(const Problem& p, int64_t first, int64_t end, int64_t panel_index) {
  if (end - first <= kTileRows) {
    MultiplyFewRows<kPanels>(p, end - first, first, panel_index);
    return;
  }
  thread_local std::vector<uint16_t> widened;
  const int64_t size = kPanels * p.panel_size();  // adjacent panels are adjacent in memory
  if (static_cast<int64_t>(widened.size()) < size) widened.resize(size);
  const int8_t* source = p.panels + panel_index * p.panel_size();
  for (int64_t e = 0; e < size; e += kPairRow) _mm512_storeu_si512(widened.data() + e, (__m512i)Widen(source + e));
  const PanelRows<false> panels{widened.data(), p.panel_size()};
  for (int64_t row = first; row < end; row += kTileRows) {
    MultiplyTile<kTileRows, kPanels>(p, std::min(row, end - kTileRows), panel_index, panels);
  }
}

// One work item: a block of rows against a run of panels, two panels per tile where the run allows.
void MultiplyItem(const Problem& p, int64_t first_row, int64_t end_row, int64_t panel, int64_t end_panel) {
  for (; panel + kTilePanels <= end_panel; panel += kTilePanels) {
    MultiplyPanels<kTilePanels>(p, first_row, end_row, panel);
  }
  if (panel < end_panel) MultiplyPanels<1>(p, first_row, end_row, panel);
}

// Every problem's items on the caller and XLA's intra-op threads (panel_work.h).
void RunAll(const Problem* problems, int num_problems, ffi::ThreadPool& pool) {
  panel_work::RunPanelItems<kMaxWeights>(problems, num_problems, {kPanelWidth, kPanelsPerItem, kBlockRows}, pool,
                                         MultiplyItem);
}

ffi::Error Int8Bf16MatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::BF16> x, ffi::Buffer<ffi::S32> num_rows,
                              ffi::RemainingArgs weights, ffi::RemainingRets results) {
  auto x_dims = x.dimensions();
  if (x_dims.size() != 2 || x_dims[1] % 2) {
    return ffi::Error::InvalidArgument("int8_bf16_matmul: x must be [rows, inner] with inner even");
  }
  if (num_rows.element_count() != 1) return ffi::Error::InvalidArgument("int8_bf16_matmul: num_rows must be one int32");
  const int num_weights = static_cast<int>(weights.size()) / 2;
  if (num_weights < 1 || num_weights > kMaxWeights || weights.size() % 2 ||
      static_cast<int>(results.size()) != num_weights) {
    return ffi::Error::InvalidArgument("int8_bf16_matmul: 1 to 4 weights, each with its scales, one result each");
  }
  const int64_t all_rows = x_dims[0], inner = x_dims[1];
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, all_rows);
  Problem problems[kMaxWeights];
  for (int w = 0; w < num_weights; ++w) {
    panel_work::WeightArgs<> args;
    if (auto error = panel_work::GetWeightArgs(weights, results, num_weights, w, args); error.failure()) return error;
    auto panel_dims = args.panel_dims;
    auto out_dims = args.out_dims;
    if (panel_dims.size() != 3 || panel_dims[1] != inner || panel_dims[2] != kPanelWidth || out_dims.size() != 2 ||
        out_dims[0] != all_rows || out_dims[1] != panel_dims[0] * kPanelWidth ||
        args.num_scales != static_cast<size_t>(out_dims[1])) {
      return ffi::Error::InvalidArgument("int8_bf16_matmul: panels must be [outer / 16, inner, 16], scales [outer] "
                                         "and results [rows, outer], agreeing with x [rows, inner]");
    }
    const int64_t outer = out_dims[1];
    float* result = args.out;
    problems[w] = Problem{reinterpret_cast<const uint16_t*>(x.typed_data()), args.panels,
                          args.scales, result, rows, inner, outer};
    std::fill(result + rows * outer, result + all_rows * outer, 0.0f);  // padding rows: zeros, finite
  }
  RunAll(problems, num_weights, pool);
  return ffi::Error::Success();
}

}  // namespace

// Only where the build targets AVX512-BF16: int8_bf16_matmul.py registers it when the library exports it.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedInt8Bf16Matmul, Int8Bf16MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());

#endif  // __AVX512F__ && __AVX512BF16__

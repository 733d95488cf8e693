// w8a8 on the CPU's int8 dot instruction VPDPBUSD (AVX-512 VNNI on zmm registers, AVX-VNNI on ymm), as an XLA FFI
// custom call: int8 activation rows (quantized per token, models/int8_activations.py) times int8 weights packed once
// at load, int32 sums, then the row's and the column's scales, float32 out. One call multiplies x by 1 to 4 weights
// (q, k and v; gate and up), one result each.
//
// Why: XLA:CPU's int8 x int8 dot runs well on AMX tiles and slowly on Zen 4's VNNI; VPDPBUSD multiplies 64 u8 x s8
// pairs and adds them in groups of 4 into 16 int32 sums per instruction, 4x the multiply-adds of a float32 FMA on
// the same register width, and reads the weights as int8 bytes.
//
// Operands, in order (vnni_matmul.py packs the weights and registers this file):
//   x          s8 [rows, inner]: the quantized activation rows.
//   row_scale  f32 [rows]: each row's scale.
//   num_rows   s32 []: rows [0, num_rows) hold real work; the others are written as zeros. Clamped to [0, rows].
//   panels     s8 [outer / 16, groups + 1, 64] per weight, groups = ceil(inner / 4): panel p holds columns 16p ..
//              16p + 15; its row g holds (W[4g + j, c] for j = 0..3) for each of its 16 columns c in turn, the
//              operand order of VPDPBUSD (k beyond inner is zero). Its last row holds the 16 columns' corrections
//              as int32: 128 * sum_k W[k, c].
//   scales     f32 [outer] per weight, after every weight's panels.
// Results, one per weight: f32 [rows, outer] = float(sum_k x[r, k] W[k, c]) * row_scale[r] * scale[c].
// The quantizing calls (AVX-512 VNNI builds; JaxpagedVnniW8A8*, JaxpagedVnniDigits*) take float32 or bfloat16 rows
// x [rows, inner] and num_rows instead of the first three operands, quantize each row themselves (vnni_rows.h: w8a8's
// int8 values, or weight-only int8's two int8 digits of 16-bit values) and return results in x's dtype.
//
// VPDPBUSD multiplies unsigned bytes by signed ones: x is shifted to unsigned once per call, x + 128 (an XOR of its
// sign bit), so the instruction sums (x + 128) * W, and the correction 128 * sum_k W[k, c], computed at pack time, is
// subtracted. The shifted rows are arranged by groups of four per row block (vnni_rows.h), so a tile's broadcasts
// step along one pointer.
// Every product and sum is an exact int32 (|sum| <= 255 * 128 * inner < 2^31 for inner < 65,000), so the result
// matches an int8 x int8 dot with int32 sums bit for bit before the scales.
//
// Work: register tiles (vnni_tiles.h: 12 rows x 2 panels with AVX-512, 6 rows x 1 panel with AVX-VNNI), each summed
// over the whole inner dimension; work items (row block, run of panels of one weight) handed out through an atomic
// counter to the caller and XLA's intra-op threads, as packed_matmul.cc does.

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
#include "tile_split.h"
#include "vnni_rows.h"
#include "xla/ffi/api/ffi.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define JAXPAGED_HAS_VNNI 1
#endif

#if defined(JAXPAGED_HAS_VNNI)

#include "vnni_tiles.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanelWidth = 16;  // columns per panel
constexpr int64_t kGroupBytes = 64;  // one panel row: 16 columns x 4 inner values
constexpr int64_t kBlockRows = 72;   // rows per work item: their int8 rows stay in L2 while the panels stream by
constexpr int64_t kPanelsPerItem = 4;
constexpr int kMaxWeights = 4;
// The smallest tile an even split of a block's rows may use: 4 rows x 2 panels is 8 independent VPDPBUSD sums, more
// than its latency needs. tile_split's default (10 rows at 12-row tiles) suits the float FMA tiles; here it made a
// 16-row block two overlapping 12-row tiles, 24 rows of work, and the even split (8 + 8) ran 1.12x faster, 13 rows
// 1.33x (one thread, benchmarks/kernels/int8_tiles).
constexpr int64_t kSmallestEvenTile = 4;

using namespace vnni_tiles;  // the register tile by vector width

// Every loop over a tile's rows and vectors is unrolled whole, so the sums stay in registers: GCC left the finishing
// loop (a few instructions a vector) rolled, which made the sums an array in memory, loaded and stored around every
// VPDPBUSD of the inner loop.
#define JAXPAGED_UNROLL _Pragma("GCC unroll 32")

struct Problem {
  const uint32_t* x;  // the rows shifted to unsigned and arranged by groups, once per call (vnni_rows.h)
  const float* row_scale;  // one per result row
  const int8_t* panels;
  const float* scales;
  float* out;  // the float32 result, or nullptr when it is rounded to bfloat16 (out_bfloat16)
  int64_t rows, inner, outer;  // rows: the rows multiplied (num_rows; digits: twice the result rows), no padding
  uint16_t* out_bfloat16 = nullptr;  // the results rounded to nearest even, as XLA's convert does
  bool digits = false;  // rows 2i and 2i + 1 are result row i's high and low int8 digits (int16_activations.py)
  int64_t groups() const { return (inner + 3) / 4; }
  int64_t panel_size() const { return (groups() + 1) * kGroupBytes; }  // the corrections' row included
};

// One result vector: `value` (exact sums as float32) scaled and stored at result row `row`, column `column`.
inline void Finish(const Problem& p, Floats value, int64_t row, int64_t column) {
  const Floats scaled = Scale(value, p.row_scale[row], p.scales + column);
#if defined(JAXPAGED_VNNI_ZMM)
  if (p.out_bfloat16 != nullptr) return Store(scaled, p.out_bfloat16 + row * p.outer + column);
#endif
  Store(scaled, p.out + row * p.outer + column);
}

// kRows rows x kPanels adjacent panels (from `panel_index`) of the output, summed over the whole inner dimension.
// The rows lie in one row block (the work items never cross one). kDigits: the rows are digit pairs (kRows even,
// `row` even), each pair finished as one result row, 256 x high + low.
template <int kRows, int kPanels, bool kDigits = false>
void MultiplyTile(const Problem& p, int64_t row, int64_t panel_index, const int8_t* upcoming, int64_t phase,
                  int64_t stride) {
  constexpr int kVectors = kPanels * kVectorsPerPanel;
  const int64_t groups = p.groups(), panel_size = p.panel_size();
  const int8_t* panel = p.panels + panel_index * panel_size;
  const int64_t block_first = row - row % kBlockRows, block_rows = std::min(kBlockRows, p.rows - block_first);
  const uint32_t* x = p.x + block_first * groups + (row - block_first);
  Acc sums[kRows][kVectors];
  JAXPAGED_UNROLL
  for (int r = 0; r < kRows; ++r) {
    JAXPAGED_UNROLL
    for (int v = 0; v < kVectors; ++v) sums[r][v] = Zero();
  }
  int64_t steps_to_prefetch = phase + 1;  // a counter, not g % stride: no division in the inner loop
  for (int64_t g = 0; g < groups; ++g, x += block_rows) {
    if (upcoming != nullptr && --steps_to_prefetch == 0) {
      steps_to_prefetch = stride;
      JAXPAGED_UNROLL
      for (int q = 0; q < kPanels; ++q) __builtin_prefetch(upcoming + q * panel_size + g * kGroupBytes, 0, 2);
    }
    Acc weights[kVectors];
    JAXPAGED_UNROLL
    for (int q = 0; q < kPanels; ++q) {
      JAXPAGED_UNROLL
      for (int h = 0; h < kVectorsPerPanel; ++h) {
        weights[q * kVectorsPerPanel + h] = LoadBytes(panel + q * panel_size + g * kGroupBytes + h * kLanes * 4);
      }
    }
    JAXPAGED_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const Acc value = Broadcast(x[r]);
      JAXPAGED_UNROLL
      for (int v = 0; v < kVectors; ++v) sums[r][v] = Dot(sums[r][v], value, weights[v]);
    }
  }
  JAXPAGED_UNROLL
  for (int q = 0; q < kPanels; ++q) {
    const int8_t* corrections = panel + q * panel_size + groups * kGroupBytes;
    JAXPAGED_UNROLL
    for (int h = 0; h < kVectorsPerPanel; ++h) {
      const int64_t column = (panel_index + q) * kPanelWidth + h * kLanes;
      const int8_t* correction = corrections + h * kLanes * 4;
      const int v = q * kVectorsPerPanel + h;
      JAXPAGED_UNROLL
      for (int r = 0; r < kRows; r += kDigits ? 2 : 1) {
        if constexpr (kDigits) {
          // The same float32 steps as int16_activations.w8a16_product: 256 x high is exact, one rounding adding low.
          Finish(p, Combine(Exact(sums[r][v], correction), Exact(sums[r + 1][v], correction)), (row + r) / 2, column);
        } else {
          Finish(p, Exact(sums[r][v], correction), row + r, column);
        }
      }
    }
  }
}

// Fewer than kTileRows rows (kDigits: digit pairs, num_rows of them), in one smaller tile.
template <int kPanels, bool kDigits>
void MultiplyFewRows(const Problem& p, int64_t num_rows, int64_t row, int64_t panel_index, const int8_t* upcoming,
                     int64_t phase, int64_t stride) {
  constexpr int kRowsPer = kDigits ? 2 : 1;
  switch (num_rows) {
#if defined(JAXPAGED_VNNI_ZMM)
    case 11: if constexpr (!kDigits) MultiplyTile<11, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
    case 10: if constexpr (!kDigits) MultiplyTile<10, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
    case 9: if constexpr (!kDigits) MultiplyTile<9, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
    case 8: if constexpr (!kDigits) MultiplyTile<8, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
    case 7: if constexpr (!kDigits) MultiplyTile<7, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
    case 6: MultiplyTile<6 * kRowsPer, kPanels, kDigits>(p, row, panel_index, upcoming, phase, stride); break;
    case 5: MultiplyTile<5 * kRowsPer, kPanels, kDigits>(p, row, panel_index, upcoming, phase, stride); break;
    case 4: MultiplyTile<4 * kRowsPer, kPanels, kDigits>(p, row, panel_index, upcoming, phase, stride); break;
#else
    case 5: if constexpr (!kDigits) MultiplyTile<5, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
    case 4: if constexpr (!kDigits) MultiplyTile<4, kPanels>(p, row, panel_index, upcoming, phase, stride); break;
#endif
    case 3: MultiplyTile<3 * kRowsPer, kPanels, kDigits>(p, row, panel_index, upcoming, phase, stride); break;
    case 2: MultiplyTile<2 * kRowsPer, kPanels, kDigits>(p, row, panel_index, upcoming, phase, stride); break;
    case 1: MultiplyTile<1 * kRowsPer, kPanels, kDigits>(p, row, panel_index, upcoming, phase, stride); break;
    default: break;
  }
}

// Rows [first, end) of kPanels panels, in the tiles tile_split.h cuts them into; digits: cut by digit pairs, half a
// tile's rows of pairs at most, so no pair is split.
template <int kPanels>
void MultiplyPanels(const Problem& p, int64_t first, int64_t end, int64_t panel_index, const int8_t* upcoming) {
  if (p.digits) {
    tile_split::ForEachTile(first / 2, end / 2, kTileRows / 2, [&](int64_t pair, int64_t pairs, int64_t t, int64_t n) {
      MultiplyFewRows<kPanels, true>(p, pairs, 2 * pair, panel_index, upcoming, t, n);
    });
    return;
  }
  tile_split::ForEachTile(first, end, kTileRows, [&](int64_t row, int64_t num_rows, int64_t t, int64_t n) {
    if (num_rows == kTileRows) {
      MultiplyTile<kTileRows, kPanels>(p, row, panel_index, upcoming, t, n);
    } else {
      MultiplyFewRows<kPanels, false>(p, num_rows, row, panel_index, upcoming, t, n);
    }
  }, kSmallestEvenTile);
}

// One work item: a block of rows against a run of panels, two panels per tile where the run allows. The tiles of
// each run of panels ask for the panels after it in memory as they go, each tile a share of the group rows (as
// packed_matmul.cc does): on one thread (benchmarks/kernels/int8_tiles) w8a8 ran 1.35x faster at 1 row, 1.3-1.4x at
// 16 rows, 1.03x at 64.
void MultiplyItem(const Problem& p, int64_t first_row, int64_t end_row, int64_t panel, int64_t end_panel) {
  const int64_t num_panels = p.outer / kPanelWidth;
  auto next = [&](int64_t at) { return at < num_panels ? p.panels + at * p.panel_size() : nullptr; };
  for (; panel + kTilePanels <= end_panel; panel += kTilePanels) {
    MultiplyPanels<kTilePanels>(p, first_row, end_row, panel, next(panel + kTilePanels));
  }
  if (panel < end_panel) MultiplyPanels<1>(p, first_row, end_row, panel, next(panel + 1));
}

// Every problem's items on the caller and XLA's intra-op threads (panel_work.h).
void RunAll(const Problem* problems, int num_problems, ffi::ThreadPool& pool) {
  panel_work::RunPanelItems<kMaxWeights>(problems, num_problems, {kPanelWidth, kPanelsPerItem, kBlockRows}, pool,
                                         MultiplyItem);
}

// Checks weight w's panels, scales and result against x [all_rows, inner]; sets `outer`.
ffi::Error CheckWeight(ffi::Span<const int64_t> panel_dims, size_t num_scales, ffi::Span<const int64_t> out_dims,
                       int64_t all_rows, int64_t inner, int64_t& outer) {
  const int64_t groups = (inner + 3) / 4;
  if (panel_dims.size() != 3 || panel_dims[1] != groups + 1 || panel_dims[2] != kGroupBytes || out_dims.size() != 2 ||
      out_dims[0] != all_rows || out_dims[1] != panel_dims[0] * kPanelWidth ||
      num_scales != static_cast<size_t>(out_dims[1])) {
    return ffi::Error::InvalidArgument("vnni_matmul: panels must be [outer / 16, ceil(inner / 4) + 1, 64], "
                                       "scales [outer] and results [rows, outer], agreeing with x [rows, inner]");
  }
  outer = out_dims[1];
  return ffi::Error::Success();
}

// The weights' count (1 to kMaxWeights, each with its scales, one result each), or an error.
ffi::Error CountWeights(const ffi::RemainingArgs& weights, const ffi::RemainingRets& results, int& num_weights) {
  num_weights = static_cast<int>(weights.size()) / 2;
  if (num_weights < 1 || num_weights > kMaxWeights || weights.size() % 2 ||
      static_cast<int>(results.size()) != num_weights) {
    return ffi::Error::InvalidArgument("vnni_matmul: 1 to 4 weights, each with its scales, one result each");
  }
  return ffi::Error::Success();
}

ffi::Error VnniMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::F32> row_scale,
                          ffi::Buffer<ffi::S32> num_rows, ffi::RemainingArgs weights, ffi::RemainingRets results) {
  auto x_dims = x.dimensions();
  if (x_dims.size() != 2 || row_scale.element_count() != static_cast<size_t>(x_dims[0])) {
    return ffi::Error::InvalidArgument("vnni_matmul: x must be [rows, inner] and row_scale [rows]");
  }
  if (num_rows.element_count() != 1) return ffi::Error::InvalidArgument("vnni_matmul: num_rows must be one int32");
  int num_weights = 0;
  if (auto error = CountWeights(weights, results, num_weights); error.failure()) return error;
  const int64_t all_rows = x_dims[0], inner = x_dims[1];
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, all_rows);
  const uint32_t* arranged_x = vnni_rows::ArrangeInt8(x.typed_data(), rows, inner, kBlockRows);
  Problem problems[kMaxWeights];
  for (int w = 0; w < num_weights; ++w) {
    panel_work::WeightArgs<> args;
    if (auto error = panel_work::GetWeightArgs(weights, results, num_weights, w, args); error.failure()) return error;
    int64_t outer = 0;
    if (auto error = CheckWeight(args.panel_dims, args.num_scales, args.out_dims, all_rows, inner, outer);
        error.failure()) {
      return error;
    }
    problems[w] = Problem{arranged_x, row_scale.typed_data(), args.panels, args.scales, args.out, rows, inner, outer};
    std::fill(args.out + rows * outer, args.out + all_rows * outer, 0.0f);  // padding rows: zeros, finite
  }
  RunAll(problems, num_weights, pool);
  return ffi::Error::Success();
}

#if defined(JAXPAGED_VNNI_ZMM) && defined(__AVX512BW__)  // vnni_rows.h's QuantizeRows
// From float rows: x (float32 or bfloat16) is quantized per row here (vnni_rows.h: the same values and scales as
// int8_activations.quantize_rows, or kDigits: int16_activations.split_rows's two int8 digits), in the pass that
// arranges it, and the results come out in x's dtype. Quantizing in XLA cost a fused reduce and elementwise pass, an
// int8 copy of x and a float32 result rounded by another pass: with them a step's w8a8 projections ran at 1.0-1.5x
// the bfloat16 panels' speed while the VNNI tiles alone ran at ~2x (docs/performance.md).
template <ffi::DataType kType, bool kDigits>
ffi::Error QuantizingImpl(ffi::ThreadPool pool, ffi::Buffer<kType> x, ffi::Buffer<ffi::S32> num_rows,
                          ffi::RemainingArgs weights, ffi::RemainingRets results) {
  using Element = ffi::NativeType<kType>;  // float, or uint16_t holding bfloat16 bits
  auto x_dims = x.dimensions();
  if (x_dims.size() != 2) return ffi::Error::InvalidArgument("vnni_matmul: x must be [rows, inner]");
  if (num_rows.element_count() != 1) return ffi::Error::InvalidArgument("vnni_matmul: num_rows must be one int32");
  int num_weights = 0;
  if (auto error = CountWeights(weights, results, num_weights); error.failure()) return error;
  const int64_t all_rows = x_dims[0], inner = x_dims[1];
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, all_rows);
  thread_local std::vector<float> row_scales;
  if (static_cast<int64_t>(row_scales.size()) < rows) row_scales.resize(rows);
  const uint32_t* arranged_x = vnni_rows::QuantizeRows<kDigits>(reinterpret_cast<const Element*>(x.typed_data()),
                                                                rows, inner, kBlockRows, row_scales.data());
  Problem problems[kMaxWeights];
  for (int w = 0; w < num_weights; ++w) {
    panel_work::WeightArgs<kType> args;
    if (auto error = panel_work::GetWeightArgs(weights, results, num_weights, w, args); error.failure()) return error;
    int64_t outer = 0;
    if (auto error = CheckWeight(args.panel_dims, args.num_scales, args.out_dims, all_rows, inner, outer);
        error.failure()) {
      return error;
    }
    Element* result = args.out;
    problems[w] = Problem{arranged_x, row_scales.data(), args.panels, args.scales, nullptr,
                          kDigits ? 2 * rows : rows, inner, outer};
    problems[w].digits = kDigits;
    if constexpr (kType == ffi::DataType::F32) {
      problems[w].out = result;
    } else {
      problems[w].out_bfloat16 = result;
    }
    std::fill(result + rows * outer, result + all_rows * outer, Element{0});  // padding rows: zeros (+0 either way)
  }
  RunAll(problems, num_weights, pool);
  return ffi::Error::Success();
}
#endif

}  // namespace

// Only where the build targets VNNI: vnni_matmul.py registers it when the library exports it.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniMatmul, VnniMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());

#if defined(JAXPAGED_VNNI_ZMM) && defined(__AVX512BW__)
// Only with AVX-512 VNNI (the quantizing pass uses AVX-512): elsewhere vnni_matmul.py quantizes in XLA.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniW8A8F32, (QuantizingImpl<ffi::DataType::F32, false>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniW8A8Bf16, (QuantizingImpl<ffi::DataType::BF16, false>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniDigitsF32, (QuantizingImpl<ffi::DataType::F32, true>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniDigitsBf16, (QuantizingImpl<ffi::DataType::BF16, true>),
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
#endif

#endif  // JAXPAGED_HAS_VNNI

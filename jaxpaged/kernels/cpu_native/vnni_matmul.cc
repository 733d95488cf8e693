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
//
// VPDPBUSD multiplies unsigned bytes by signed ones: x is shifted to unsigned once per call, x + 128 (an XOR of its
// sign bit), so the instruction sums (x + 128) * W, and the correction 128 * sum_k W[k, c], computed at pack time, is
// subtracted.
// Every product and sum is an exact int32 (|sum| <= 255 * 128 * inner < 2^31 for inner < 65,000), so the result
// matches an int8 x int8 dot with int32 sums bit for bit before the scales.
//
// Work: register tiles (12 rows x 2 panels with AVX-512, 6 rows x 1 panel with AVX-VNNI), each summed over the whole
// inner dimension; work items (row block, run of panels of one weight) handed out through an atomic counter to the
// caller and XLA's intra-op threads, as packed_matmul.cc does.

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

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kPanelWidth = 16;  // columns per panel
constexpr int64_t kGroupBytes = 64;  // one panel row: 16 columns x 4 inner values
constexpr int64_t kBlockRows = 72;   // rows per work item: their int8 rows stay in L2 while the panels stream by
constexpr int64_t kPanelsPerItem = 4;
constexpr int kMaxWeights = 4;

// JAXPAGED_VNNI_YMM builds the ymm tiling on an AVX-512 VNNI CPU too (the tests check it there).
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && !defined(JAXPAGED_VNNI_YMM)
#define JAXPAGED_VNNI_ZMM 1
// One zmm holds a whole panel row: 16 columns' int32 sums. A vector of int32 rather than __m512i (whose elements are
// int64): VPDPBUSD's builtin takes int32 vectors, and the casts between the two kept GCC from holding an array of
// __m512i sums in registers (each was loaded and stored around every VPDPBUSD).
typedef int32_t Acc __attribute__((vector_size(64)));
constexpr int kVectorsPerPanel = 1;
constexpr int kLanes = 16;
constexpr int64_t kTileRows = 12;
constexpr int kTilePanels = 2;
inline Acc Zero() { return Acc{}; }
inline Acc LoadBytes(const int8_t* at) { return (Acc)_mm512_loadu_si512(at); }
inline Acc Broadcast(uint32_t four) { return (Acc)_mm512_set1_epi32(static_cast<int32_t>(four)); }
inline Acc Dot(Acc sum, Acc unsigned_x, Acc weights) {
  return (Acc)_mm512_dpbusd_epi32((__m512i)sum, (__m512i)unsigned_x, (__m512i)weights);
}
// (sum - correction) as float32, times the row's scale, then each column's; stored to `out`.
inline __m512 Scaled(Acc sum, const int8_t* correction, float row_scale, const float* scale) {
  const __m512i exact = _mm512_sub_epi32((__m512i)sum, _mm512_loadu_si512(correction));
  const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(row_scale));
  return _mm512_mul_ps(scaled, _mm512_loadu_ps(scale));
}
inline void Finish(Acc sum, const int8_t* correction, float row_scale, const float* scale, float* out) {
  _mm512_storeu_ps(out, Scaled(sum, correction, row_scale, scale));
}
// The same, rounded to bfloat16 to nearest even (a NaN stays a quiet NaN), as XLA's convert rounds.
inline void Finish(Acc sum, const int8_t* correction, float row_scale, const float* scale, uint16_t* out) {
  const __m512 value = Scaled(sum, correction, row_scale, scale);
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
  rounded = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(rounded));
}
#else
// AVX-VNNI: a panel row is two ymm halves, columns 0-7 and 8-15 (int32 vectors, as with zmm above).
typedef int32_t Acc __attribute__((vector_size(32)));
constexpr int kVectorsPerPanel = 2;
constexpr int kLanes = 8;
constexpr int64_t kTileRows = 6;
constexpr int kTilePanels = 1;
inline Acc Zero() { return Acc{}; }
inline Acc LoadBytes(const int8_t* at) { return (Acc)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)); }
inline Acc Broadcast(uint32_t four) { return (Acc)_mm256_set1_epi32(static_cast<int32_t>(four)); }
#if defined(__AVX512VL__) && defined(__AVX512VNNI__)
inline Acc Dot(Acc sum, Acc unsigned_x, Acc weights) {
  return (Acc)_mm256_dpbusd_epi32((__m256i)sum, (__m256i)unsigned_x, (__m256i)weights);
}
#else
inline Acc Dot(Acc sum, Acc unsigned_x, Acc weights) {
  return (Acc)_mm256_dpbusd_avx_epi32((__m256i)sum, (__m256i)unsigned_x, (__m256i)weights);
}
#endif
inline void Finish(Acc sum, const int8_t* correction, float row_scale, const float* scale, float* out) {
  const __m256i exact = _mm256_sub_epi32((__m256i)sum, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(correction)));
  const __m256 scaled = _mm256_mul_ps(_mm256_cvtepi32_ps(exact), _mm256_set1_ps(row_scale));
  _mm256_storeu_ps(out, _mm256_mul_ps(scaled, _mm256_loadu_ps(scale)));
}
#endif

// Every loop over a tile's rows and vectors is unrolled whole, so the sums stay in registers: GCC left the finishing
// loop (Finish's six instructions a vector) rolled, which made the sums an array in memory, loaded and stored around
// every VPDPBUSD of the inner loop.
#define JAXPAGED_UNROLL _Pragma("GCC unroll 32")

struct Problem {
  const uint32_t* x;  // the rows shifted to unsigned and arranged by groups, once per call (vnni_rows.h)
  const float* row_scale;
  const int8_t* panels;
  const float* scales;
  float* out;  // the float32 result, or nullptr when it is rounded to bfloat16 (out_bfloat16)
  int64_t rows, inner, outer;  // rows: the rows multiplied (num_rows), not the padding after them
  uint16_t* out_bfloat16 = nullptr;  // the results rounded to nearest even, as XLA's convert does
  int64_t groups() const { return (inner + 3) / 4; }
  int64_t panel_size() const { return (groups() + 1) * kGroupBytes; }  // the corrections' row included
};

// kRows rows x kPanels adjacent panels (from `panel_index`) of the output, summed over the whole inner dimension.
// The rows lie in one row block (the work items never cross one).
template <int kRows, int kPanels>
void MultiplyTile(const Problem& p, int64_t row, int64_t panel_index) {
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
  for (int64_t g = 0; g < groups; ++g, x += block_rows) {
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
  const int64_t first_column = panel_index * kPanelWidth;
  JAXPAGED_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t at = (row + r) * p.outer + first_column;
    const float row_scale = p.row_scale[row + r];
    JAXPAGED_UNROLL
    for (int q = 0; q < kPanels; ++q) {
      const int8_t* corrections = panel + q * panel_size + groups * kGroupBytes;
      JAXPAGED_UNROLL
      for (int h = 0; h < kVectorsPerPanel; ++h) {
        const int64_t column = q * kPanelWidth + h * kLanes;
        const Acc sum = sums[r][q * kVectorsPerPanel + h];
        const int8_t* correction = corrections + h * kLanes * 4;
        const float* scale = p.scales + first_column + column;
#if defined(JAXPAGED_VNNI_ZMM)
        if (p.out_bfloat16 != nullptr) {
          Finish(sum, correction, row_scale, scale, p.out_bfloat16 + at + column);
          continue;
        }
#endif
        Finish(sum, correction, row_scale, scale, p.out + at + column);
      }
    }
  }
}

// Fewer than kTileRows rows, in one smaller tile (only when the whole block is smaller than a tile).
template <int kPanels>
void MultiplyFewRows(const Problem& p, int64_t num_rows, int64_t row, int64_t panel_index) {
  switch (num_rows) {
#if defined(JAXPAGED_VNNI_ZMM)
    case 11: MultiplyTile<11, kPanels>(p, row, panel_index); break;
    case 10: MultiplyTile<10, kPanels>(p, row, panel_index); break;
    case 9: MultiplyTile<9, kPanels>(p, row, panel_index); break;
    case 8: MultiplyTile<8, kPanels>(p, row, panel_index); break;
    case 7: MultiplyTile<7, kPanels>(p, row, panel_index); break;
    case 6: MultiplyTile<6, kPanels>(p, row, panel_index); break;
#endif
    case 5: MultiplyTile<5, kPanels>(p, row, panel_index); break;
    case 4: MultiplyTile<4, kPanels>(p, row, panel_index); break;
    case 3: MultiplyTile<3, kPanels>(p, row, panel_index); break;
    case 2: MultiplyTile<2, kPanels>(p, row, panel_index); break;
    case 1: MultiplyTile<1, kPanels>(p, row, panel_index); break;
    default: break;
  }
}

// Rows [first, end) of kPanels panels, in the tiles tile_split.h cuts them into.
template <int kPanels>
void MultiplyPanels(const Problem& p, int64_t first, int64_t end, int64_t panel_index) {
  tile_split::ForEachTile(first, end, kTileRows, [&](int64_t row, int64_t num_rows, int64_t, int64_t) {
    if (num_rows == kTileRows) {
      MultiplyTile<kTileRows, kPanels>(p, row, panel_index);
    } else {
      MultiplyFewRows<kPanels>(p, num_rows, row, panel_index);
    }
  });
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
    panel_work::WeightArgs args;
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

#if defined(JAXPAGED_VNNI_ZMM)
// w8a8 from float rows: x (float32 or bfloat16) is quantized per row here (vnni_rows.h: the same q and scales as
// int8_activations.quantize_rows), in the pass that arranges it, and the results come out in x's dtype. Quantizing
// in XLA cost a fused reduce and elementwise pass, an int8 copy of x and a float32 result rounded by another pass:
// with them a step's w8a8 projections ran at 1.0-1.5x the bfloat16 panels' speed while the VNNI tiles alone ran at
// ~2x (docs/performance.md).
template <ffi::DataType kType>
ffi::Error VnniW8A8Impl(ffi::ThreadPool pool, ffi::Buffer<kType> x, ffi::Buffer<ffi::S32> num_rows,
                        ffi::RemainingArgs weights, ffi::RemainingRets results) {
  using Element = ffi::NativeType<kType>;  // float, or uint16_t holding bfloat16 bits
  auto x_dims = x.dimensions();
  if (x_dims.size() != 2) return ffi::Error::InvalidArgument("vnni_w8a8: x must be [rows, inner]");
  if (num_rows.element_count() != 1) return ffi::Error::InvalidArgument("vnni_w8a8: num_rows must be one int32");
  int num_weights = 0;
  if (auto error = CountWeights(weights, results, num_weights); error.failure()) return error;
  const int64_t all_rows = x_dims[0], inner = x_dims[1];
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, all_rows);
  thread_local std::vector<float> row_scales;
  if (static_cast<int64_t>(row_scales.size()) < rows) row_scales.resize(rows);
  const uint32_t* arranged_x = vnni_rows::QuantizeRows(reinterpret_cast<const Element*>(x.typed_data()), rows,
                                                       inner, kBlockRows, row_scales.data());
  Problem problems[kMaxWeights];
  for (int w = 0; w < num_weights; ++w) {
    auto panels = weights.get<ffi::Buffer<ffi::S8>>(w);
    auto scales = weights.get<ffi::Buffer<ffi::F32>>(num_weights + w);
    auto out = results.get<ffi::Buffer<kType>>(w);
    if (panels.has_error()) return panels.error();
    if (scales.has_error()) return scales.error();
    if (out.has_error()) return out.error();
    int64_t outer = 0;
    if (auto error = CheckWeight(panels->dimensions(), scales->element_count(), (*out)->dimensions(), all_rows,
                                 inner, outer);
        error.failure()) {
      return error;
    }
    Element* result = reinterpret_cast<Element*>((*out)->typed_data());
    problems[w] = Problem{arranged_x, row_scales.data(), panels->typed_data(), scales->typed_data(), nullptr,
                          rows, inner, outer};
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

#if defined(JAXPAGED_VNNI_ZMM)
// Only with AVX-512 VNNI (the quantizing pass uses AVX-512): elsewhere vnni_matmul.py quantizes in XLA.
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniW8A8F32, VnniW8A8Impl<ffi::DataType::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedVnniW8A8Bf16, VnniW8A8Impl<ffi::DataType::BF16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());
#endif

#endif  // JAXPAGED_HAS_VNNI

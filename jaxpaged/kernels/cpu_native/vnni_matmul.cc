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
inline void Finish(Acc sum, const int8_t* correction, float row_scale, const float* scale, float* out) {
  const __m512i exact = _mm512_sub_epi32((__m512i)sum, _mm512_loadu_si512(correction));
  const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(row_scale));
  _mm512_storeu_ps(out, _mm512_mul_ps(scaled, _mm512_loadu_ps(scale)));
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
  const uint32_t* x;  // the rows shifted to unsigned and arranged by groups, once per call: see ArrangeRows
  const float* row_scale;
  const int8_t* panels;
  const float* scales;
  float* out;
  int64_t rows, inner, outer;  // rows: the rows multiplied (num_rows), not the padding after them
  int64_t groups() const { return (inner + 3) / 4; }
  int64_t panel_size() const { return (groups() + 1) * kGroupBytes; }  // the corrections' row included
};

// x's first `rows` rows shifted to unsigned (x XOR 0x80 in each byte is x + 128) and arranged for the tiles, into a
// buffer reused by the calls on this thread: block b of kBlockRows rows (the work items' row blocks; the last may be
// shorter, n rows) starts at b * kBlockRows * groups and holds group g of its row r (four bytes, one 32-bit word) at
// g * n + r. So a tile's broadcasts of one group read adjacent words off one pointer that steps by n words a group
// (row-major rows took a general register per tile row), and the inner loop has no partial group: a last group that
// is no whole four values is read as it exists and filled with shifted zeros (its weights are zero).
const uint32_t* ArrangeRows(const int8_t* x, int64_t rows, int64_t inner) {
  thread_local std::vector<uint32_t> arranged;
  const int64_t groups = (inner + 3) / 4, full_groups = inner / 4;
  if (static_cast<int64_t>(arranged.size()) < rows * groups) arranged.resize(rows * groups);
  for (int64_t first = 0; first < rows; first += kBlockRows) {
    const int64_t block_rows = std::min(kBlockRows, rows - first);
    uint32_t* block = arranged.data() + first * groups;
    for (int64_t r = 0; r < block_rows; ++r) {
      const int8_t* row = x + (first + r) * inner;
      for (int64_t g = 0; g < full_groups; ++g) {
        uint32_t four;
        std::memcpy(&four, row + 4 * g, sizeof(four));
        block[g * block_rows + r] = four ^ 0x80808080u;
      }
      if (full_groups < groups) {
        uint32_t four = 0;
        std::memcpy(&four, row + 4 * full_groups, static_cast<size_t>(inner - 4 * full_groups));
        block[full_groups * block_rows + r] = four ^ 0x80808080u;
      }
    }
  }
  return arranged.data();
}

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
  JAXPAGED_UNROLL
  for (int r = 0; r < kRows; ++r) {
    float* out = p.out + (row + r) * p.outer + panel_index * kPanelWidth;
    const float row_scale = p.row_scale[row + r];
    JAXPAGED_UNROLL
    for (int q = 0; q < kPanels; ++q) {
      const int8_t* corrections = panel + q * panel_size + groups * kGroupBytes;
      JAXPAGED_UNROLL
      for (int h = 0; h < kVectorsPerPanel; ++h) {
        const int64_t column = q * kPanelWidth + h * kLanes;
        Finish(sums[r][q * kVectorsPerPanel + h], corrections + h * kLanes * 4, row_scale,
               p.scales + panel_index * kPanelWidth + column, out + column);
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

ffi::Error VnniMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S8> x, ffi::Buffer<ffi::F32> row_scale,
                          ffi::Buffer<ffi::S32> num_rows, ffi::RemainingArgs weights, ffi::RemainingRets results) {
  auto x_dims = x.dimensions();
  if (x_dims.size() != 2 || row_scale.element_count() != static_cast<size_t>(x_dims[0])) {
    return ffi::Error::InvalidArgument("vnni_matmul: x must be [rows, inner] and row_scale [rows]");
  }
  if (num_rows.element_count() != 1) return ffi::Error::InvalidArgument("vnni_matmul: num_rows must be one int32");
  const int num_weights = static_cast<int>(weights.size()) / 2;
  if (num_weights < 1 || num_weights > kMaxWeights || weights.size() % 2 ||
      static_cast<int>(results.size()) != num_weights) {
    return ffi::Error::InvalidArgument("vnni_matmul: 1 to 4 weights, each with its scales, one result each");
  }
  const int64_t all_rows = x_dims[0], inner = x_dims[1];
  const int64_t rows = std::clamp<int64_t>(num_rows.typed_data()[0], 0, all_rows);
  const uint32_t* arranged_x = ArrangeRows(x.typed_data(), rows, inner);
  Problem problems[kMaxWeights];
  for (int w = 0; w < num_weights; ++w) {
    panel_work::WeightArgs args;
    if (auto error = panel_work::GetWeightArgs(weights, results, num_weights, w, args); error.failure()) return error;
    auto panel_dims = args.panel_dims;
    auto out_dims = args.out_dims;
    const int64_t groups = (inner + 3) / 4;
    if (panel_dims.size() != 3 || panel_dims[1] != groups + 1 || panel_dims[2] != kGroupBytes ||
        out_dims.size() != 2 || out_dims[0] != all_rows || out_dims[1] != panel_dims[0] * kPanelWidth ||
        args.num_scales != static_cast<size_t>(out_dims[1])) {
      return ffi::Error::InvalidArgument("vnni_matmul: panels must be [outer / 16, ceil(inner / 4) + 1, 64], "
                                         "scales [outer] and results [rows, outer], agreeing with x [rows, inner]");
    }
    const int64_t outer = out_dims[1];
    float* result = args.out;
    problems[w] = Problem{arranged_x, row_scale.typed_data(), args.panels, args.scales, result, rows, inner, outer};
    std::fill(result + rows * outer, result + all_rows * outer, 0.0f);  // padding rows: zeros, finite
  }
  RunAll(problems, num_weights, pool);
  return ffi::Error::Success();
}

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

#endif  // JAXPAGED_HAS_VNNI

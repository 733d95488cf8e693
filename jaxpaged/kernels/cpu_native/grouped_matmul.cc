// The grouped matmul of a mixture-of-experts layer on the CPU, as XLA FFI custom calls: rows of x sorted by expert,
// each group of rows multiplied by its own expert's weight, read as stored ([experts, inner, outer]) or packed.
//
// Why: jax.lax.ragged_dot lowers on XLA:CPU to a dense dot over every expert, masked afterwards: G times the
// multiply-adds and every expert's weights read, where a decode step touches a few experts with a few rows each.
// Here only the non-empty groups' weights are read, each once per call (a group's rows are one block while they fit
// in L2), and nothing is computed for padding rows.
//
// Operands, in order (see grouped_matmul.py, which registers this file):
//   x            f32 [rows, inner]: every dtype's x is float32 (the wrapper casts a bfloat16 x; x is small).
//   group_sizes  s32 [groups]: group i owns rows [start_i, start_i + group_sizes[i]), start_i the sum of the earlier
//                sizes. Negative sizes count as 0; a group is cut where the rows end. Rows at or past the sum are
//                padding: written as zeros, never multiplied.
//   weights      [groups, inner, outer] row-major, as checkpoints and the model store them, or packed into panels
//                [groups, ceil(outer / 128), inner, 128] (the last one zero-padded; told apart by rank), so that a
//                work item streams one contiguous panel instead of walking a strided column strip: f32, bf16 (widened
//                to float32 in registers by a shift) or s8 (widened by VPMOVSXBD and VCVTDQ2PS).
//   scales       optional f32 [groups, outer]: group i's output column j is multiplied by scales[i, j] (weight-only
//                int8), once, on the finished float32 sum.
// Result: f32 [rows, outer], float32 sums.
//
// Work: register tiles of packed_tiles.h's size (6 rows x 16 columns with AVX2, 12 rows x 32 columns with AVX-512),
// each summed over the whole inner dimension, reading kVectors vectors of one weight row per inner step (as stored, a
// strided walk down a column strip, each step one or more whole 64-byte lines). Work items are (group, row block,
// run of kRunColumns columns: one panel), handed out through an atomic counter to the caller and XLA's intra-op threads
// (packed_matmul.cc's scheme); items of one group run together, so a group's row block stays in cache while its
// weight streams by. Each tile asks for the weight rows kPrefetchRows steps ahead of the ones it multiplies, into L2:
// a decode's tiny tiles issue too few loads of their own to keep memory busy, and the hardware prefetcher does not
// follow a strided walk across pages.

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
#include "vec8.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using packed_tiles::kLanes;
using packed_tiles::kTileRows;
using packed_tiles::Vec;

// Rows per block: a block's rows of x (72 x 2,048 floats, Qwen3-30B-A3B's hidden, 576 KiB) stay in L2 while the
// group's weight streams by. A decode's group (a few rows) is one block, so its weight is read once per call.
constexpr int64_t kBlockRows = 72;
// Columns per work item: 768-wide experts (Qwen3-30B-A3B) give 6 items per group, enough to keep 2 threads busy at
// one token's 8 groups; a multiple of both tiles' widths.
constexpr int64_t kRunColumns = 128;
// Vectors per tile row: 2 (16 columns with AVX2, 32 with AVX-512), as packed_matmul.cc's tiles, for groups of a
// whole tile's rows or more. Groups of few rows (every decode group) take wider tiles, as many accumulators or fewer,
// so that each inner step reads a longer run of the weight row (a whole 128-column run with AVX-512 at up to 2 rows):
// memory serves that better than the same bytes in several passes down narrow strided column strips (one token's
// 8 groups in float32: 2.6 GB/s on the touched experts against 1.6 with the 32-column strips only).
constexpr int kTileVectors = 2;
#if defined(__AVX512F__)
constexpr int kMaxAccumulators = 24;  // of 32 zmm registers: the rest hold the loaded weight vectors and x
constexpr int kWideVectors = 8, kWideRows = 2, kMidVectors = 4, kMidRows = 5;
#else
constexpr int kMaxAccumulators = 12;  // of 16 ymm registers
constexpr int kWideVectors = 4, kWideRows = 2, kMidVectors = 2, kMidRows = 5;
#endif
// Inner steps ahead that a tile asks for weight rows. One token's 8 groups in float32 (2-core EPYC, loaded): none
// 2.1 GB/s, 8 rows 2.2, 16 2.6, 32 2.5; 32 the best in bfloat16 (4.9 against 4.1) and at 8 and 64 tokens.
constexpr int64_t kPrefetchRows = 32;

static_assert(kRunColumns % (kTileVectors * kLanes) == 0, "a work item holds whole tiles");

// The weights' element types, each loaded as float32 vectors. kFromMemory: the tiles ask for the rows ahead
// (false for a strip already widened into a per-thread buffer, which is in L2).
struct Float32 {
  using Element = float;
  static constexpr bool kFromMemory = true;
  static Vec Load(const float* at) { return *reinterpret_cast<const Vec*>(at); }
};

struct WidenedStrip : Float32 {
  static constexpr bool kFromMemory = false;
};

struct Bfloat16 {
  using Element = uint16_t;  // bfloat16 bits, as XLA's FFI hands them over; float32 is the same bits shifted up 16
  static constexpr bool kFromMemory = true;
  static Vec Load(const uint16_t* at) {
#if defined(__AVX512F__)
    const __m512i widened = _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))), 16);
#elif defined(__AVX2__)
    const __m256i widened = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))), 16);
#else
    uint32_t widened[kLanes];
    for (int k = 0; k < kLanes; ++k) widened[k] = static_cast<uint32_t>(at[k]) << 16;
#endif
    Vec loaded;
    std::memcpy(&loaded, &widened, sizeof(loaded));
    return loaded;
  }
};

struct Int8 {
  using Element = int8_t;
  static constexpr bool kFromMemory = true;
  static Vec Load(const int8_t* at) { return packed_tiles::Int8::Load(at); }  // reads kLanes bytes
};

inline float ScalarOf(float value) { return value; }
inline float ScalarOf(int8_t value) { return static_cast<float>(value); }
inline float ScalarOf(uint16_t bits) { return vec8::ToF32(bits); }

// What every tile of a call shares, whatever its weights' element type.
struct Operands {
  const float* x;       // [rows, inner]
  const float* scales;  // [groups, outer] or nullptr
  float* out;           // [rows, outer]
  int64_t inner, outer;
};

// A column strip of one group's weight: element (i, c) of the strip at strip[i * stride + c].
template <typename T>
struct Strip {
  const typename T::Element* at;
  int64_t stride;
};

// The weights in either layout: as stored, [groups, inner, outer] (one panel of `outer` columns), or packed into
// panels of kRunColumns columns, [groups, panels, inner, kRunColumns] (the last panel zero-padded).
template <typename T>
struct Problem : Operands {
  const typename T::Element* weights;
  int64_t panel_columns, group_stride, panel_stride;  // row stride: panel_columns
  Strip<T> StripAt(int64_t group, int64_t column) const {
    return {weights + group * group_stride + (column / panel_columns) * panel_stride + column % panel_columns,
            panel_columns};
  }
};

// One tile: kRows rows from `row` x kVectors vectors of columns from `column` of group `group`, summed over the whole
// inner dimension from `strip`; weights from memory ask for the rows kPrefetchRows steps ahead as they go.
template <typename T, int kRows, int kVectors>
inline void MultiplyTile(const Operands& o, Strip<T> strip, int64_t group, int64_t row, int64_t column) {
  Vec sums[kRows][kVectors];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) sums[r][v] = Vec{};
  }
  const float* x = o.x + row * o.inner;
  constexpr int64_t kRowBytes = kVectors * kLanes * sizeof(typename T::Element);
  // The prefetch runs past the group's last row by kPrefetchRows rows: harmless, and cheaper than a test per step.
  for (int64_t i = 0; i < o.inner; ++i) {
    const typename T::Element* at = strip.at + i * strip.stride;
    if constexpr (T::kFromMemory && kPrefetchRows > 0) {
      const char* ahead = reinterpret_cast<const char*>(at + kPrefetchRows * strip.stride);
      for (int64_t b = 0; b < kRowBytes; b += 64) __builtin_prefetch(ahead + b, 0, 2);
    }
    Vec loaded[kVectors];
    for (int v = 0; v < kVectors; ++v) loaded[v] = T::Load(at + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const float value = x[r * o.inner + i];
      for (int v = 0; v < kVectors; ++v) sums[r][v] += value * loaded[v];
    }
  }
  if (o.scales != nullptr) {
    for (int v = 0; v < kVectors; ++v) {
      Vec scale;
      std::memcpy(&scale, o.scales + group * o.outer + column + v * kLanes, sizeof(scale));
      for (int r = 0; r < kRows; ++r) sums[r][v] *= scale;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float* out = o.out + (row + r) * o.outer + column;
    for (int v = 0; v < kVectors; ++v) std::memcpy(out + v * kLanes, &sums[r][v], sizeof(Vec));
  }
}

// Fewer than kTileRows rows in one smaller tile (a group smaller than a tile: every decode group). Only tiles whose
// accumulators fit the registers are built; the callers pick kVectors so that they do.
template <typename T, int kVectors, int kRows = 1>
void MultiplyFewRows(const Operands& o, Strip<T> strip, int64_t group, int64_t num_rows, int64_t row,
                     int64_t column) {
  if constexpr (kRows < kTileRows && kRows * kVectors <= kMaxAccumulators) {
    if (num_rows == kRows) {
      MultiplyTile<T, kRows, kVectors>(o, strip, group, row, column);
    } else {
      MultiplyFewRows<T, kVectors, kRows + 1>(o, strip, group, num_rows, row, column);
    }
  }
}

// Rows [first, end) of one group, kVectors vectors of columns from `column`, in whole tiles. Rows left over after the
// whole tiles are covered by one more whole tile ending at `end`, overlapping the tile before it (rows computed twice
// get the same sums twice; packed_matmul.cc measured a small tile for them at half the FMA rate).
template <typename T, int kVectors>
void MultiplyRows(const Operands& o, Strip<T> strip, int64_t group, int64_t first, int64_t end, int64_t column) {
  if (end - first < kTileRows) {
    MultiplyFewRows<T, kVectors>(o, strip, group, end - first, first, column);
    return;
  }
  if constexpr (kTileRows * kVectors <= kMaxAccumulators) {  // wider strips are only ever given fewer rows
    for (int64_t row = first; row < end; row += kTileRows) {
      MultiplyTile<T, kTileRows, kVectors>(o, strip, group, std::min(row, end - kTileRows), column);
    }
  }
}

// bfloat16 and int8 strips under more than one tile's rows are widened to float32 once, into a per-thread buffer that
// stays in L2 (inner x 32 floats with AVX-512: 256 KiB at a hidden of 2,048), and every tile runs the float32 tile
// over it: widening in each tile repeats it once per tile (6 times for a 64-row group), and the widening
// instructions share the FMA ports (packed_matmul.cc measured the same for its int8 panels). Memory still delivers
// the narrow bytes, once.
template <typename T, int kVectors>
void MultiplyRowsWidened(const Problem<T>& p, Strip<T> strip, int64_t group, int64_t first, int64_t end,
                         int64_t column) {
  constexpr int64_t kWidth = kVectors * kLanes;
  constexpr int64_t kRowBytes = kWidth * sizeof(typename T::Element);
  thread_local std::vector<float> widened;
  if (static_cast<int64_t>(widened.size()) < p.inner * kWidth) widened.resize(p.inner * kWidth);
  for (int64_t i = 0; i < p.inner; ++i) {
    const typename T::Element* at = strip.at + i * strip.stride;
    const char* ahead = reinterpret_cast<const char*>(at + kPrefetchRows * strip.stride);
    for (int64_t b = 0; b < kRowBytes; b += 64) __builtin_prefetch(ahead + b, 0, 2);
    for (int v = 0; v < kVectors; ++v) {
      const Vec loaded = T::Load(at + v * kLanes);
      std::memcpy(widened.data() + i * kWidth + v * kLanes, &loaded, sizeof(loaded));
    }
  }
  MultiplyRows<WidenedStrip, kVectors>(p, Strip<WidenedStrip>{widened.data(), kWidth}, group, first, end, column);
}

// The last outer % kLanes columns (only where outer is not a multiple of the vector width): plain loops over the
// strip from `column`.
template <typename T>
void MultiplyColumnTail(const Operands& o, Strip<T> strip, int64_t group, int64_t first, int64_t end, int64_t column,
                        int64_t end_column) {
  for (int64_t row = first; row < end; ++row) {
    for (int64_t c = column; c < end_column; ++c) {
      float sum = 0.0f;
      for (int64_t i = 0; i < o.inner; ++i) {
        sum += o.x[row * o.inner + i] * ScalarOf(strip.at[i * strip.stride + (c - column)]);
      }
      o.out[row * o.outer + c] = o.scales != nullptr ? sum * o.scales[group * o.outer + c] : sum;
    }
  }
}

struct Item {
  int64_t group, first_row, end_row, column;
};

// The items of one call, shared with the pool's tasks: a task that starts after the call returned finds no item left
// and touches nothing else, so the call never waits for a task to start, only for every item to be done.
template <typename T>
struct SharedWork {
  Problem<T> problem;
  std::vector<Item> items;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> num_done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

// The item's columns from `column` in strips of kVectors vectors, as far as whole strips go; returns where they end.
template <typename T, int kVectors>
int64_t MultiplyStrips(const Problem<T>& p, const Item& item, int64_t column, int64_t end_column) {
  for (; column + kVectors * kLanes <= end_column; column += kVectors * kLanes) {
    const Strip<T> strip = p.StripAt(item.group, column);
    if constexpr (!std::is_same_v<T, Float32>) {
      if (item.end_row - item.first_row > kTileRows) {
        MultiplyRowsWidened<T, kVectors>(p, strip, item.group, item.first_row, item.end_row, column);
        continue;
      }
    }
    MultiplyRows<T, kVectors>(p, strip, item.group, item.first_row, item.end_row, column);
  }
  return column;
}

template <typename T>
void WorkOn(SharedWork<T>& work) {
  const Problem<T>& p = work.problem;
  const int64_t num_items = static_cast<int64_t>(work.items.size());
  for (int64_t index = work.next.fetch_add(1); index < num_items; index = work.next.fetch_add(1)) {
    const Item& item = work.items[index];
    const int64_t end_column = std::min(p.outer, item.column + kRunColumns);
    const int64_t num_rows = item.end_row - item.first_row;
    int64_t column = item.column;
    if (num_rows <= kWideRows) {
      column = MultiplyStrips<T, kWideVectors>(p, item, column, end_column);
    } else if (num_rows <= kMidRows) {
      column = MultiplyStrips<T, kMidVectors>(p, item, column, end_column);
    }
    column = MultiplyStrips<T, kTileVectors>(p, item, column, end_column);
    column = MultiplyStrips<T, 1>(p, item, column, end_column);
    if (column < end_column) MultiplyColumnTail(p, p.StripAt(item.group, column), item.group, item.first_row, item.end_row, column,
                         end_column);
    if (work.num_done.fetch_add(1) + 1 == num_items) {
      std::lock_guard<std::mutex> lock(work.mutex);
      work.all_done.notify_all();
    }
  }
}

// Checks the operands, zeroes the padding rows and runs every non-empty group's items on the caller and on XLA's
// intra-op threads. kWeightType: the weights' element type; T: how they are loaded.
template <typename T, ffi::DataType kWeightType>
ffi::Error Run(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> group_sizes,
               ffi::Buffer<kWeightType> weights, ffi::RemainingArgs optional_scales,
               ffi::ResultBuffer<ffi::F32> out) {
  const auto x_dims = x.dimensions();
  const auto weight_dims = weights.dimensions();
  const auto out_dims = out->dimensions();
  const bool panels = weight_dims.size() == 4;
  if (x_dims.size() != 2 || out_dims.size() != 2 || out_dims[0] != x_dims[0] ||
      (weight_dims.size() != 3 && !panels) || weight_dims[panels ? 2 : 1] != x_dims[1] ||
      (!panels && out_dims[1] != weight_dims[2]) ||
      (panels && (weight_dims[3] != kRunColumns || weight_dims[1] != (out_dims[1] + kRunColumns - 1) / kRunColumns))) {
    return ffi::Error::InvalidArgument("grouped_matmul: x must be [rows, inner], weights [groups, inner, outer] or "
                                       "panels [groups, ceil(outer / 128), inner, 128], the result [rows, outer]");
  }
  const int64_t num_groups = weight_dims[0], rows = x_dims[0], inner = x_dims[1], outer = out_dims[1];
  if (group_sizes.element_count() != static_cast<size_t>(num_groups)) {
    return ffi::Error::InvalidArgument("grouped_matmul: group_sizes must hold one size per group of the weights");
  }
  const float* scales = nullptr;
  if (optional_scales.size() > 1) {
    return ffi::Error::InvalidArgument("grouped_matmul: at most one scales operand");
  }
  if (optional_scales.size() == 1) {
    auto scale_buffer = optional_scales.get<ffi::Buffer<ffi::F32>>(0);
    if (scale_buffer.has_error()) return scale_buffer.error();
    if (scale_buffer->element_count() != static_cast<size_t>(num_groups * outer)) {
      return ffi::Error::InvalidArgument("grouped_matmul: scales must be [groups, outer]");
    }
    scales = scale_buffer->typed_data();
  }
  auto work = std::make_shared<SharedWork<T>>();
  const int64_t panel_columns = panels ? kRunColumns : std::max<int64_t>(outer, 1);
  const int64_t panel_stride = inner * panel_columns;
  const int64_t group_stride = panels ? weight_dims[1] * panel_stride : inner * outer;
  work->problem = Problem<T>{{x.typed_data(), scales, out->typed_data(), inner, outer}, weights.typed_data(),
                             panel_columns, group_stride, panel_stride};
  const int32_t* sizes = group_sizes.typed_data();
  int64_t start = 0;
  for (int64_t group = 0; group < num_groups && start < rows; ++group) {
    const int64_t end = std::min(rows, start + std::max<int64_t>(sizes[group], 0));
    for (int64_t first = start; first < end; first += kBlockRows) {
      for (int64_t column = 0; column < outer; column += kRunColumns) {
        work->items.push_back(Item{group, first, std::min(end, first + kBlockRows), column});
      }
    }
    start = end;
  }
  // The padding rows' results are zeros: finite, whatever runs on them next.
  std::fill(work->problem.out + start * outer, work->problem.out + rows * outer, 0.0f);
  const int64_t num_items = static_cast<int64_t>(work->items.size());
  if (num_items == 0 || work->problem.inner == 0) {
    std::fill(work->problem.out, work->problem.out + start * outer, 0.0f);  // an empty sum
    return ffi::Error::Success();
  }
  const int64_t num_helpers = std::min<int64_t>(pool.num_threads(), num_items - 1);
  for (int64_t i = 0; i < num_helpers; ++i) {
    pool.Schedule([work]() { WorkOn(*work); });
  }
  WorkOn(*work);
  std::unique_lock<std::mutex> lock(work->mutex);
  work->all_done.wait(lock, [&]() { return work->num_done.load() == num_items; });
  return ffi::Error::Success();
}

constexpr auto GroupedMatmulImpl = Run<Float32, ffi::DataType::F32>;
constexpr auto GroupedMatmulBfloat16Impl = Run<Bfloat16, ffi::DataType::BF16>;
constexpr auto GroupedMatmulInt8Impl = Run<Int8, ffi::DataType::S8>;

}  // namespace

#define JAXPAGED_GROUPED_MATMUL_HANDLER(name, impl, weight_type) \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, impl,                      \
                                ffi::Ffi::Bind()                 \
                                    .Ctx<ffi::ThreadPool>()      \
                                    .Arg<ffi::Buffer<ffi::F32>>() \
                                    .Arg<ffi::Buffer<ffi::S32>>() \
                                    .Arg<ffi::Buffer<weight_type>>() \
                                    .RemainingArgs()             \
                                    .Ret<ffi::Buffer<ffi::F32>>());

JAXPAGED_GROUPED_MATMUL_HANDLER(JaxpagedGroupedMatmul, GroupedMatmulImpl, ffi::F32)
JAXPAGED_GROUPED_MATMUL_HANDLER(JaxpagedGroupedMatmulBfloat16, GroupedMatmulBfloat16Impl, ffi::BF16)
JAXPAGED_GROUPED_MATMUL_HANDLER(JaxpagedGroupedMatmulInt8, GroupedMatmulInt8Impl, ffi::S8)

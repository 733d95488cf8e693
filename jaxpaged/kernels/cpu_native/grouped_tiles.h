// The grouped matmul's register tiles (grouped_matmul.cc includes this file; its build key hashes it too): a work
// item's rows of one group times a run of kRunColumns columns of the group's weight, as stored ([groups, inner,
// outer]) or packed into panels ([groups, ceil(outer / 128), inner, 128]).
//
// Register tiles of packed_tiles.h's size (6 rows x 16 columns with AVX2, 12 rows x 32 columns with AVX-512), each
// summed over the whole inner dimension, reading kVectors vectors of one weight row per inner step (as stored, a
// strided walk down a column strip, each step one or more whole 64-byte lines). Each tile asks for the weight rows
// kPrefetchRows steps ahead of the ones it multiplies, into L2: a decode's tiny tiles issue too few loads of their own
// to keep memory busy, and the hardware prefetcher does not follow a strided walk across pages.

#ifndef JAXPAGED_CPU_NATIVE_GROUPED_TILES_H_
#define JAXPAGED_CPU_NATIVE_GROUPED_TILES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "grouped_elements.h"
#include "packed_tiles.h"

namespace grouped_tiles {

using packed_tiles::kLanes;
using packed_tiles::kTileRows;
using packed_tiles::Vec;

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

using grouped_elements::Float32;
using grouped_elements::WidenedStrip;

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
        sum += o.x[row * o.inner + i] * T::Scalar(strip.at[i * strip.stride + (c - column)]);
      }
      o.out[row * o.outer + c] = o.scales != nullptr ? sum * o.scales[group * o.outer + c] : sum;
    }
  }
}

// Rows [first, end) of `group`, the columns from `column` in strips of kVectors vectors, as far as whole strips go;
// returns where they end.
template <typename T, int kVectors>
int64_t MultiplyStrips(const Problem<T>& p, int64_t group, int64_t first, int64_t end, int64_t column,
                       int64_t end_column) {
  for (; column + kVectors * kLanes <= end_column; column += kVectors * kLanes) {
    const Strip<T> strip = p.StripAt(group, column);
    if constexpr (!std::is_same_v<T, Float32>) {
      if (end - first > kTileRows) {
        MultiplyRowsWidened<T, kVectors>(p, strip, group, first, end, column);
        continue;
      }
    }
    MultiplyRows<T, kVectors>(p, strip, group, first, end, column);
  }
  return column;
}

// Rows [first, end) of `group`, the run of kRunColumns columns from `column` (one work item): in the widest strips
// the row count allows, then narrower ones, then the column tail.
template <typename T>
void MultiplyRun(const Problem<T>& p, int64_t group, int64_t first, int64_t end, int64_t column) {
  const int64_t end_column = std::min(p.outer, column + kRunColumns);
  if (end - first <= kWideRows) {
    column = MultiplyStrips<T, kWideVectors>(p, group, first, end, column, end_column);
  } else if (end - first <= kMidRows) {
    column = MultiplyStrips<T, kMidVectors>(p, group, first, end, column, end_column);
  }
  column = MultiplyStrips<T, kTileVectors>(p, group, first, end, column, end_column);
  column = MultiplyStrips<T, 1>(p, group, first, end, column, end_column);
  if (column < end_column) MultiplyColumnTail(p, p.StripAt(group, column), group, first, end, column, end_column);
}

}  // namespace grouped_tiles

#endif  // JAXPAGED_CPU_NATIVE_GROUPED_TILES_H_

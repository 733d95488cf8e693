// The grouped matmul's path for groups of few rows (every decode group: one token's 8 groups have one row each), on
// weights as stored ([groups, inner, outer], row-major). grouped_matmul.cc includes this file (its build key hashes
// it too).
//
// Why: at a row or two per group the call only reads weights, so what counts is how memory serves the reads. The tile
// path walks a column strip of kRunColumns columns down the rows (strided: 512 of every 1,024 bytes at a width of
// 256), two work items per row of 256 columns; this path walks a chunk of the group's weight rows in order, each
// [outer] row contiguous, so a work item streams one contiguous run of the weight, asking for a few KiB ahead: the
// random Qwen3-MoE's grouped matmuls at one token went from 10.7 to 14.9 GB/s on the touched experts on a 2-core
// EPYC (docs/benchmarks.md, "Mixture of experts"). One row's sums stay in registers where the expert is at most
// kRegisterVectors wide; otherwise the sums are kept per row in a small buffer in L1 (rows x outer floats), four
// weight rows added per pass over it.
//
// Work: each streamed group's weight rows are cut into chunks (Chunking), one work item each; a chunk's sums go to
// its own slice of a per-call scratch, and the item that finishes a group's last chunk adds the chunks' sums in chunk
// order (so the result does not depend on which thread ran which chunk), scales them and writes the group's rows.

#ifndef JAXPAGED_CPU_NATIVE_GROUPED_STREAM_H_
#define JAXPAGED_CPU_NATIVE_GROUPED_STREAM_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "packed_tiles.h"

namespace grouped_stream {

using packed_tiles::kLanes;
using packed_tiles::Vec;

// Groups of up to this many rows stream (more rows: the register tiles reuse each weight vector more often).
constexpr int64_t kMaxRows = 4;
// Weight rows summed per pass over the row sums: 4 loads and stores of the sums per 4 weight vectors.
constexpr int64_t kRowsPerPass = 4;
// Bytes ahead of the rows being summed that a chunk asks for (into L2). The hardware prefetcher alone kept too few
// reads in flight: without these requests the random Qwen3-MoE's touched experts were read 3x slower; 16, 32 and
// 64 KiB ahead measured the same as 4 (2-core EPYC, loaded).
constexpr int64_t kPrefetchBytes = 4096;
// A chunk reads at least this many weight bytes (so that the per-item work, zeroing and adding a chunk's sums, stays
// small beside its reads), and the streamed groups of a call are cut into about kTargetItems chunks in all (enough
// to share 2 to 16 threads; and the scratch, rows x outer floats per chunk, stays small).
constexpr int64_t kMinChunkBytes = 64 * 1024;
constexpr int64_t kTargetItems = 64;

// Whether a group of `num_rows` rows streams: a few rows, on weights as stored (not packed panels), of some columns.
inline bool Streams(int64_t num_rows, bool panels, int64_t outer) {
  return !panels && outer > 0 && num_rows >= 1 && num_rows <= kMaxRows;
}

// How many chunks each of `num_groups` streamed groups of an [inner, outer] weight of `element_bytes` elements is cut
// into: at least 1, at most inner, chunks of at least kMinChunkBytes.
inline int64_t Chunking(int64_t num_groups, int64_t inner, int64_t outer, int64_t element_bytes) {
  const int64_t by_bytes = std::max<int64_t>(1, inner * outer * element_bytes / kMinChunkBytes);
  const int64_t by_items = std::max<int64_t>(1, (kTargetItems + num_groups - 1) / std::max<int64_t>(num_groups, 1));
  return std::max<int64_t>(1, std::min({by_bytes, by_items, inner}));
}

// Asks for the weight bytes [from, from + count) of a chunk of `chunk_bytes` bytes at `chunk` into L2; bytes past
// its end from `upcoming` (the chunk this thread runs next; nullptr: none), so that memory stays busy across the
// hand-over from one chunk to the next. A prefetch past the upcoming chunk's end is harmless (it never faults).
inline void AskAhead(const char* chunk, int64_t chunk_bytes, const void* upcoming, int64_t from, int64_t count) {
  for (int64_t b = from; b < from + count; b += 64) {
    if (b < chunk_bytes) {
      __builtin_prefetch(chunk + b, 0, 2);
    } else if (upcoming != nullptr) {
      __builtin_prefetch(static_cast<const char*>(upcoming) + (b - chunk_bytes), 0, 2);
    }
  }
}

// Up to this many vectors of one row's sums stay in registers for a whole chunk (of 32 zmm or 16 ymm registers).
constexpr int kRegisterVectors = 16;

// SumRows for one row of x and a weight of whole vectors, at most kRegisterVectors of them (a 256-wide float32 expert
// with AVX-512): the sums stay in registers, and the weight rows are read in order, one after another (about 5%
// faster than the sums in L1 at the random Qwen3-MoE's gate and up, alternated on the loaded 2-core EPYC).
template <typename T>
void SumOneRowInRegisters(const float* x, const typename T::Element* weight, int64_t vectors, int64_t first,
                          int64_t end, float* sums, const void* upcoming) {
  const int64_t outer = vectors * kLanes, row_bytes = outer * static_cast<int64_t>(sizeof(typename T::Element));
  const char* chunk = reinterpret_cast<const char*>(weight + first * outer);
  Vec acc[kRegisterVectors] = {};
  for (int64_t i = first; i < end; ++i) {
    const typename T::Element* row = weight + i * outer;
    AskAhead(chunk, (end - first) * row_bytes, upcoming, (i - first) * row_bytes + kPrefetchBytes, row_bytes);
    const float value = x[i];
    for (int v = 0; v < kRegisterVectors; ++v) {
      if (v < vectors) acc[v] += value * T::Load(row + v * kLanes);
    }
  }
  for (int v = 0; v < kRegisterVectors; ++v) {
    if (v < vectors) std::memcpy(sums + v * kLanes, &acc[v], sizeof(Vec));
  }
}

// sums[r * outer + c] = sum over i in [first, end) of x[r * inner + i] * weight[i * outer + c], for kRows rows of x;
// `weight` is one group's [inner, outer] matrix. T: the weights' element type (Element; Load reads kLanes of them
// as one float32 vector; Scalar widens one). Asks for the bytes kPrefetchBytes ahead of each pass's rows (AskAhead;
// without, the touched experts were read 3x slower).
template <typename T, int kRows>
void SumRows(const float* x, int64_t inner, const typename T::Element* weight, int64_t outer, int64_t first,
             int64_t end, float* sums, const void* upcoming) {
  using Element = typename T::Element;
  const int64_t vectors = outer / kLanes, vector_end = vectors * kLanes;
  const int64_t row_bytes = outer * static_cast<int64_t>(sizeof(Element));
  const char* chunk = reinterpret_cast<const char*>(weight + first * outer);
  const int64_t chunk_bytes = (end - first) * row_bytes;
  if (kRows == 1 && vector_end == outer && vectors <= kRegisterVectors) {
    return SumOneRowInRegisters<T>(x, weight, vectors, first, end, sums, upcoming);
  }
  std::fill(sums, sums + kRows * outer, 0.0f);
  for (int64_t i = first; i < end; i += kRowsPerPass) {
    const int64_t pass_rows = std::min<int64_t>(kRowsPerPass, end - i);
    const Element* rows = weight + i * outer;
    AskAhead(chunk, chunk_bytes, upcoming, (i - first) * row_bytes + kPrefetchBytes, pass_rows * row_bytes);
    float xs[kRows][kRowsPerPass] = {};
    for (int r = 0; r < kRows; ++r) {
      for (int64_t j = 0; j < pass_rows; ++j) xs[r][j] = x[r * inner + i + j];
    }
    if (pass_rows == kRowsPerPass) {
      for (int64_t v = 0; v < vectors; ++v) {
        const Element* at = rows + v * kLanes;
        const Vec w0 = T::Load(at), w1 = T::Load(at + outer), w2 = T::Load(at + 2 * outer);
        const Vec w3 = T::Load(at + 3 * outer);
        for (int r = 0; r < kRows; ++r) {
          Vec sum;
          std::memcpy(&sum, sums + r * outer + v * kLanes, sizeof(sum));
          sum += xs[r][0] * w0 + xs[r][1] * w1 + xs[r][2] * w2 + xs[r][3] * w3;
          std::memcpy(sums + r * outer + v * kLanes, &sum, sizeof(sum));
        }
      }
    } else {  // the chunk's last rows, fewer than a pass
      for (int64_t j = 0; j < pass_rows; ++j) {
        for (int64_t v = 0; v < vectors; ++v) {
          const Vec w = T::Load(rows + j * outer + v * kLanes);
          for (int r = 0; r < kRows; ++r) {
            Vec sum;
            std::memcpy(&sum, sums + r * outer + v * kLanes, sizeof(sum));
            sum += xs[r][j] * w;
            std::memcpy(sums + r * outer + v * kLanes, &sum, sizeof(sum));
          }
        }
      }
    }
    // The last outer % kLanes columns (only where outer is not a multiple of the vector width).
    for (int64_t c = vector_end; c < outer; ++c) {
      for (int r = 0; r < kRows; ++r) {
        float sum = sums[r * outer + c];
        for (int64_t j = 0; j < pass_rows; ++j) sum += xs[r][j] * T::Scalar(rows[j * outer + c]);
        sums[r * outer + c] = sum;
      }
    }
  }
}

// SumRows for 1 to kMaxRows rows, the row count chosen at run time.
template <typename T>
void SumFewRows(int64_t num_rows, const float* x, int64_t inner, const typename T::Element* weight, int64_t outer,
                int64_t first, int64_t end, float* sums, const void* upcoming) {
  static_assert(kMaxRows == 4, "one case per row count");
  switch (num_rows) {
    case 1: return SumRows<T, 1>(x, inner, weight, outer, first, end, sums, upcoming);
    case 2: return SumRows<T, 2>(x, inner, weight, outer, first, end, sums, upcoming);
    case 3: return SumRows<T, 3>(x, inner, weight, outer, first, end, sums, upcoming);
    default: return SumRows<T, 4>(x, inner, weight, outer, first, end, sums, upcoming);
  }
}

// A group of few rows streamed in chunks: chunk c's sums at partials + partial_offset + c * num_rows * outer (a
// group of one chunk writes straight to the result); chunks_left counts down as chunks finish.
struct StreamedGroup {
  int64_t group, first_row, num_rows, num_chunks, partial_offset;
  std::atomic<int64_t> chunks_left;

  void Start(int64_t group_index, int64_t first, int64_t rows, int64_t chunks, int64_t offset) {
    group = group_index, first_row = first, num_rows = rows, num_chunks = chunks, partial_offset = offset;
    chunks_left.store(chunks);
  }
};

// out[r, c] = (sum over the chunks of partials[chunk][r, c]) * scales[c] (no scales: nullptr), for num_rows rows of
// `outer` columns; the chunks' sums lie one after another, in chunk order (partials nullptr: one chunk, already in
// out).
inline void AddChunks(const float* partials, int64_t num_chunks, int64_t num_rows, int64_t outer,
                      const float* scales, float* out) {
  const int64_t size = num_rows * outer;
  if (partials != nullptr) {
    std::memcpy(out, partials, size * sizeof(float));
    for (int64_t chunk = 1; chunk < num_chunks; ++chunk) {
      const float* part = partials + chunk * size;
      for (int64_t e = 0; e < size; ++e) out[e] += part[e];
    }
  }
  if (scales != nullptr) {
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t c = 0; c < outer; ++c) out[r * outer + c] *= scales[c];
    }
  }
}

// Chunk `chunk` (weight rows [first_inner, end_inner)) of a streamed group: its rows' sums into its slice of
// `partials` (a group's only chunk: into the result); the group's last chunk to finish adds the chunks up in chunk
// order, scales them and writes the group's rows of `out`. x [rows, inner], weights [groups, inner, outer] (group g
// at g * group_stride), scales [groups, outer] or nullptr, out [rows, outer]; `upcoming`: the first weight bytes of
// the chunk this thread runs next (or nullptr).
template <typename T>
void RunChunk(StreamedGroup& streamed, int64_t chunk, int64_t first_inner, int64_t end_inner, const float* x,
              int64_t inner, const typename T::Element* weights, int64_t group_stride, int64_t outer,
              const float* scales, float* out, float* partials, const void* upcoming) {
  const int64_t size = streamed.num_rows * outer;
  float* group_out = out + streamed.first_row * outer;
  float* group_partials = streamed.num_chunks == 1 ? nullptr : partials + streamed.partial_offset;
  float* sums = group_partials == nullptr ? group_out : group_partials + chunk * size;
  SumFewRows<T>(streamed.num_rows, x + streamed.first_row * inner, inner, weights + streamed.group * group_stride,
                outer, first_inner, end_inner, sums, upcoming);
  if (streamed.chunks_left.fetch_sub(1) == 1) {  // the last chunk: every other chunk's sums are written
    AddChunks(group_partials, streamed.num_chunks, streamed.num_rows, outer,
              scales == nullptr ? nullptr : scales + streamed.group * outer, group_out);
  }
}

}  // namespace grouped_stream

#endif  // JAXPAGED_CPU_NATIVE_GROUPED_STREAM_H_

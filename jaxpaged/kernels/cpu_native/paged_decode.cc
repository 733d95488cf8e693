// Paged attention for the CPU, as an XLA FFI custom call: every q row attends over its sequence's paged K/V up to
// its own position, read in place through the block table (no gathered copy), online softmax in float32. A decode
// is one row; a prefill chunk's consecutive rows are taken a block at a time, so each K/V row read serves the whole
// block.
//
// Operands (see paged_decode.py, which builds and registers this file):
//   q            f32  [rows, kv_heads, group, head_dim]   already multiplied by the softmax scale
//   kv_pages     f32 | bf16 | u16 (bfloat16 bits) [pages, page_size, 2 * kv_heads, head_dim]   K of head h at 2h, V at 2h + 1
//                or s8 | u8 (int8 / float8_e4m3fn codes) [pages, page_size, 2 * kv_heads, head_dim + 2]: each row's
//                codes, then its bfloat16 scale (kv_codes.h), multiplied in as the row is widened
//   positions    s32  [rows]   the row's position (it sees KV 0..position); < 0: no work, zeros out
//   row_seqs     s32  [rows]   the block-table row of the row's sequence
//   block_tables s32  [seqs, pages_per_seq]
//   sinks        f32  [kv_heads * group] or [0]: attention sinks (gpt-oss), one logit per q head that joins the
//                softmax's denominator only; empty: none
// Attributes: sliding_window (0: none), soft_cap (0: none). Result: f32 [rows, kv_heads, group, head_dim].
//
// Work items are blocks of rows (consecutive rows of one sequence at consecutive positions, up to kMaxBlockRows),
// handed out through an atomic counter to the caller and to XLA's intra-op threads. Each walks its pages in order,
// reading each page once, contiguously, for all its kv heads and rows.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kv_codes.h"
#include "vec8.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace vec8;      // NOLINT: the kernel's vector vocabulary (vec8.h)
using namespace kv_codes;  // NOLINT: and the quantized rows' (kv_codes.h)

constexpr int kMaxGroup = 16;      // q heads per kv head
constexpr int kMaxRows = 256;      // q heads of a block (its rows x the model's q heads)
constexpr int kMaxPageSize = 256;  // tokens per page
// Rows of a prefill chunk per block. Each K/V row is read once for the block, from L1, instead of once per row from
// L2; 8 rows of SmolLM2's 9 q heads keep the block's q (18 KiB) and one kv head's logits of a page (8 rows x 3 q
// heads x 16 tokens) in L1.
constexpr int64_t kMaxBlockRows = 8;
constexpr int64_t kMaxWeights = 8192;  // a block's logits of one page and kv head: rows x group x page_size floats

struct Problem {
  const float* q;
  const void* kv;
  const int32_t* positions;
  const int32_t* row_seqs;
  const int32_t* block_tables;
  const float* sinks;  // nullptr: none
  float* out;
  int64_t num_rows, num_seqs, num_kv_heads, group, head_dim, num_pages, page_size, pages_per_seq;
  int64_t sliding_window;
  float soft_cap;
  int64_t row_width;  // elements of one head's K (or V) row: head_dim, or head_dim codes + the scale (RowWidth)
};

// One work item: rows [first_row, first_row + num_rows) of one sequence, at consecutive positions.
struct Block {
  int64_t first_row, num_rows;
};

// The first KV position a token at `position` sees: its sliding window's start, else 0.
inline int64_t WindowStart(const Problem& p, int64_t position) {
  return p.sliding_window > 0 ? std::max<int64_t>(0, position - p.sliding_window + 1) : 0;
}

// Page `page` of the pool, or nullptr for an id outside it (never in a valid table; nothing out of bounds is read).
template <typename T>
inline const T* PageAt(const Problem& p, int64_t page) {
  if (page < 0 || page >= p.num_pages) return nullptr;
  return static_cast<const T*>(p.kv) + page * p.page_size * 2 * p.num_kv_heads * p.row_width;
}

// The block-table row of a q row's sequence (clamped into the table: padding rows have no work anyway).
inline const int32_t* TableOf(const Problem& p, int64_t row) {
  const int64_t seq = std::min<int64_t>(std::max<int32_t>(p.row_seqs[row], 0), p.num_seqs - 1);
  return p.block_tables + seq * p.pages_per_seq;
}

// The first page a block reads, or nullptr when it has no work.
template <typename T>
const T* FirstPage(const Problem& p, const Block& block) {
  const int32_t position = p.positions[block.first_row];
  if (position < 0) return nullptr;
  return PageAt<T>(p, TableOf(p, block.first_row)[WindowStart(p, position) / p.page_size]);
}

// Pages sit anywhere in the pool and the hardware prefetcher only follows the run within a page: token t's rows of
// one kv head ask for the same rows of the next page (`next_head_kv`, nullptr if none), and the page's last token
// [t1 - 1] also for the rows it does not reach, so the next page streams into L2 while this one is worked on.
template <typename T>
__attribute__((always_inline)) inline void PrefetchRowsAhead(const T* next_head_kv, int64_t t, int64_t t1,
                                                             int64_t page_size, int64_t row_stride, int64_t bytes) {
  if (next_head_kv == nullptr) return;
  const int64_t rows_ahead = t + 1 < t1 ? 1 : page_size - t;
  for (int64_t r = 0; r < rows_ahead; ++r) PrefetchToL2(next_head_kv + (t + r) * row_stride, bytes);
}

// `count` bfloat16 rows of kHeadDim values (or quantized rows of kHeadDim codes), `stride` elements apart, widened to
// float32 into `out` (rows kHeadDim apart): the form the K and V passes read a bfloat16 or quantized page in, once per
// page and kv head for all its q heads. A quantized row's scale goes to `scales[t]`, not into its values: the callers
// apply it once per logit (K) or per weight (V), not once per value.
template <int kHeadDim, typename T>
inline void WidenRows(const T* rows, int64_t stride, int64_t count, float* out, float* scales) {
  for (int64_t t = 0; t < count; ++t) {
    const T* row = rows + t * stride;
    if constexpr (kQuantized<T>) scales[t] = RowScale(row, kHeadDim);
    for (int c = 0; c < kHeadDim / 8; ++c) *reinterpret_cast<Vec8*>(out + t * kHeadDim + 8 * c) = Load8(row + 8 * c);
  }
}

// The logits of a page's tokens [t0, t1) for every row and q head of one kv head's group, into
// weights[(row * group + g) * page_size + t], each K row read once; each token's rows ask for the next page's
// (PrefetchRowsAhead). float32: token by token, the K row held in registers for every (row, q head). bfloat16: eight
// tokens at a time, their K rows widened once into L1; each (row, q head) keeps its q in registers and sums the eight
// tokens' products, and one transposing reduction turns the eight partial sums into eight logits. The kernel before
// (one token at a time, widening K for every q head, and V for every q head too, one horizontal sum per logit) read a
// bfloat16 pool at about half the float32 pool's rate: it was computing, not waiting on memory. Eight tokens at a
// time made float32 decodes slower, so float32 keeps one token at a time (figures: docs/performance.md, CPU attention).
template <typename T, int kHeadDim>
void PageLogits(const Problem& p, const T* head_kv, const T* next_head_kv, int64_t t0, int64_t t1, int64_t num_rows,
                int64_t head, const float* q, float* weights) {
  constexpr int kChunks = kHeadDim / 8;
  const int64_t group = p.group, page_size = p.page_size, num_heads = p.num_kv_heads;
  const int64_t row_stride = 2 * num_heads * p.row_width;
  const int64_t head_row_bytes = 2 * p.row_width * static_cast<int64_t>(sizeof(T));
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t t = t0; t < t1; ++t) {
      PrefetchRowsAhead(next_head_kv, t, t1, page_size, row_stride, head_row_bytes);
      const float* k = head_kv + t * row_stride;
      Vec8 k_row[kChunks];
      for (int c = 0; c < kChunks; ++c) k_row[c] = Load8(k + 8 * c);
      for (int64_t i = 0; i < num_rows; ++i) {
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = q + ((i * num_heads + head) * group + g) * kHeadDim;
          Vec8 sum = Load8(qg) * k_row[0];
          for (int c = 1; c < kChunks; ++c) sum += Load8(qg + 8 * c) * k_row[c];
          weights[(i * group + g) * page_size + t] = Sum8(sum);
        }
      }
    }
  } else {
    float widened[8 * kHeadDim];
    Vec8 k_scales = Vec8{} + 1.0f;  // quantized rows: the eight rows' scales, applied to their eight logits
    for (int64_t t = t0; t < t1; t += 8) {
      const int64_t n = std::min<int64_t>(8, t1 - t);
      const float* k_rows[8];
      for (int64_t j = 0; j < n; ++j) {
        PrefetchRowsAhead(next_head_kv, t + j, t1, page_size, row_stride, head_row_bytes);
        WidenRows<kHeadDim>(head_kv + (t + j) * row_stride, row_stride, 1, widened + j * kHeadDim,
                            reinterpret_cast<float*>(&k_scales) + j);
        k_rows[j] = widened + j * kHeadDim;
      }
      for (int64_t j = n; j < 8; ++j) k_rows[j] = k_rows[n - 1];  // a short last chunk repeats a row, dropped below
      for (int64_t i = 0; i < num_rows; ++i) {
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = q + ((i * num_heads + head) * group + g) * kHeadDim;
          Vec8 q_vec[kChunks];
          for (int c = 0; c < kChunks; ++c) q_vec[c] = Load8(qg + 8 * c);
          Vec8 sums[8];
          for (int j = 0; j < 8; ++j) {
            Vec8 sum = q_vec[0] * Load8(k_rows[j]);
            for (int c = 1; c < kChunks; ++c) sum += q_vec[c] * Load8(k_rows[j] + 8 * c);
            sums[j] = sum;
          }
          Vec8 logits = Sum8Each(sums);
          if constexpr (kQuantized<T>) logits *= k_scales;
          float* w = weights + (i * group + g) * page_size + t;
          if (n == 8) {
            *reinterpret_cast<Vec8*>(w) = logits;
          } else {
            for (int64_t j = 0; j < n; ++j) w[j] = logits[j];
          }
        }
      }
    }
  }
}

// The page's V rows [t0, t1) of one kv head, weighted, added to the accumulators of every row and q head of its
// group: each (row, q head) sums its whole head_dim in registers over the tokens, the V rows staying in L1 for the
// others; bfloat16 rows are widened into L1 once, 16 at a time, for all of them.
template <typename T, int kHeadDim>
void AccumulateV(const Problem& p, const T* head_v, int64_t t0, int64_t t1, int64_t num_rows, int64_t head,
                 const float* weights, float* out) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int64_t kTokens = 16;
  const int64_t group = p.group, page_size = p.page_size, num_heads = p.num_kv_heads;
  const int64_t row_stride = 2 * num_heads * p.row_width;
  float widened[kTokens * kHeadDim];
  float v_scales[kTokens];  // quantized rows: each row's scale, folded into its weight
  for (int64_t start = t0; start < t1; start += kTokens) {
    const int64_t count = std::min(t1, start + kTokens) - start;
    const float* v_rows;
    int64_t v_stride;
    if constexpr (std::is_same_v<T, float>) {
      v_rows = head_v + start * row_stride;
      v_stride = row_stride;
    } else {
      WidenRows<kHeadDim>(head_v + start * row_stride, row_stride, count, widened, v_scales);
      v_rows = widened;
      v_stride = kHeadDim;
    }
    for (int64_t i = 0; i < num_rows; ++i) {
      for (int64_t g = 0; g < group; ++g) {
        const float* w = weights + (i * group + g) * page_size + start;
        float* acc_row = out + ((i * num_heads + head) * group + g) * kHeadDim;
        Vec8 acc[kChunks];
        for (int c = 0; c < kChunks; ++c) acc[c] = Load8(acc_row + 8 * c);
        for (int64_t t = 0; t < count; ++t) {
          const float* v = v_rows + t * v_stride;
          const float weight = kQuantized<T> ? w[t] * v_scales[t] : w[t];
          for (int c = 0; c < kChunks; ++c) acc[c] += weight * Load8(v + 8 * c);
        }
        for (int c = 0; c < kChunks; ++c) *reinterpret_cast<Vec8*>(acc_row + 8 * c) = acc[c];
      }
    }
  }
}

// One block of rows (a decode: a block of one), every kv head: the pages its rows see, in order, each page read once,
// contiguously (all heads' K/V of a token sit in one row). Per page and kv head: the logits of the page's tokens for
// every row and q head of the group (K read once for all of them), one rescale of each running sum, then the
// weighted V rows. Row i of the block is at first_position + i and sees the tokens from its window's start up to its
// own position; the others in a page get weight 0 (only the block's last pages, or a sliding window's first, hold
// any). kHeadDim > 0 fixes head_dim at compile time (the common sizes: the loops unroll); 0 reads it from the problem.
// `upcoming`: the first page of the block this thread works on next (nullptr if none).
template <typename T, int kHeadDim>
void AttendBlock(const Problem& p, const Block& block, const T* upcoming) {
  const int64_t group = p.group, page_size = p.page_size, num_heads = p.num_kv_heads;
  const int64_t head_dim = kHeadDim > 0 ? kHeadDim : p.head_dim;
  const int64_t heads_per_row = num_heads * group;  // q heads of one row
  const int64_t num_rows = block.num_rows;
  // Accumulators, divided by the sums at the end; (row i, kv head, g) is q head (i * num_heads + head) * group + g.
  float* out = p.out + block.first_row * heads_per_row * head_dim;
  std::fill(out, out + num_rows * heads_per_row * head_dim, 0.0f);
  const int32_t first_position = p.positions[block.first_row];
  if (first_position < 0) return;
  const float* q = p.q + block.first_row * heads_per_row * head_dim;
  const int64_t first = WindowStart(p, first_position);  // the first token any row of the block sees
  const int64_t end = static_cast<int64_t>(first_position) + num_rows;  // one past the last row's position
  const int64_t row_stride = 2 * num_heads * p.row_width;  // one token of one page
  const int64_t head_row_bytes = 2 * p.row_width * static_cast<int64_t>(sizeof(T));  // one head's K and V of a token
  const int32_t* table = TableOf(p, block.first_row);

  float running_max[kMaxRows], running_sum[kMaxRows];
  float weights[kMaxWeights];  // [row i * group + g][token of the page], rows page_size apart
  std::fill(running_max, running_max + num_rows * heads_per_row, -std::numeric_limits<float>::infinity());
  std::fill(running_sum, running_sum + num_rows * heads_per_row, 0.0f);

  for (int64_t page_index = first / page_size; page_index * page_size < end; ++page_index) {
    const T* page_kv = PageAt<T>(p, table[page_index]);
    if (page_kv == nullptr) continue;
    const int64_t page_start = page_index * page_size;
    const int64_t t0 = std::max(first, page_start) - page_start;
    const int64_t t1 = std::min(end, page_start + page_size) - page_start;
    // The page read after this one (after the last page: the next block's first), asked for into L2 while this one is
    // worked on. Asking for the whole next page into L1 at the page's start instead evicted the page being read, and
    // gave about half the useful bandwidth (docs/performance.md, CPU attention).
    const T* next_page_kv = page_start + page_size < end ? PageAt<T>(p, table[page_index + 1]) : upcoming;
    for (int64_t head = 0; head < num_heads; ++head) {
      const T* head_kv = page_kv + 2 * head * p.row_width;
      const T* next_head_kv = next_page_kv == nullptr ? nullptr : next_page_kv + 2 * head * p.row_width;
      if constexpr (kHeadDim > 0) {
        PageLogits<T, kHeadDim>(p, head_kv, next_head_kv, t0, t1, num_rows, head, q, weights);
      } else {
        for (int64_t t = t0; t < t1; ++t) {  // logits, K read once for every row and q head of the group
          const T* k = head_kv + t * row_stride;
          const float k_scale = RowScale(k, head_dim);
          PrefetchRowsAhead(next_head_kv, t, t1, page_size, row_stride, head_row_bytes);
          for (int64_t i = 0; i < num_rows; ++i) {
            const float* q_head = q + (i * num_heads + head) * group * head_dim;
            for (int64_t g = 0; g < group; ++g) {
              const float* qg = q_head + g * head_dim;
              float dot = 0.0f;
              for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * (ToF32(k[d]) * k_scale);
              weights[(i * group + g) * page_size + t] = dot;
            }
          }
        }
      }
      if (p.soft_cap > 0.0f) {
        for (int64_t j = 0; j < num_rows * group; ++j) {
          float* w = weights + j * page_size;
          for (int64_t t = t0; t < t1; ++t) w[t] = p.soft_cap * std::tanh(w[t] / p.soft_cap);
        }
      }
      for (int64_t i = 0; i < num_rows; ++i) {  // per row, the tokens of this page it sees: [lo, hi)
        const int64_t position = first_position + i;
        const int64_t lo = std::clamp(WindowStart(p, position) - page_start, t0, t1);
        const int64_t hi = std::clamp(position + 1 - page_start, lo, t1);
        for (int64_t g = 0; g < group; ++g) {  // one rescale per page, then the page's weights
          float* w = weights + (i * group + g) * page_size;
          std::fill(w + t0, w + lo, 0.0f);
          std::fill(w + hi, w + t1, 0.0f);
          if (lo == hi) continue;  // the row sees none of this page: its sums stay as they are
          const int64_t row = (i * num_heads + head) * group + g;
          float page_max = running_max[row];
          for (int64_t t = lo; t < hi; ++t) page_max = std::max(page_max, w[t]);
          const float rescale = running_sum[row] > 0.0f ? ExpNonPositive(running_max[row] - page_max) : 0.0f;
          running_max[row] = page_max;
          float page_sum = 0.0f;
          for (int64_t t = lo; t < hi; ++t) {
            w[t] = ExpNonPositive(w[t] - page_max);
            page_sum += w[t];
          }
          running_sum[row] = running_sum[row] * rescale + page_sum;
          float* acc = out + row * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) acc[d] *= rescale;
        }
      }
      // The weighted V rows. With a compiled head size each (row, q head) sums its whole head_dim in registers over
      // the page's tokens, the page's V rows staying in L1 for the block's other rows (faster prefill, decodes
      // unchanged); bfloat16 rows are widened once, into L1, for all of them. Otherwise token by token into the
      // accumulators in memory. (Summing register-sized chunks of head_dim over the tokens, one chunk at a time, was
      // slower, decode and prefill; figures: docs/performance.md.)
      if constexpr (kHeadDim > 0) {
        AccumulateV<T, kHeadDim>(p, head_kv + p.row_width, t0, t1, num_rows, head, weights, out);
      } else {
        for (int64_t t = t0; t < t1; ++t) {
          const T* v = head_kv + t * row_stride + p.row_width;
          const float v_scale = RowScale(v, head_dim);
          for (int64_t i = 0; i < num_rows; ++i) {
            for (int64_t g = 0; g < group; ++g) {
              const float weight = weights[(i * group + g) * page_size + t];
              float* acc = out + ((i * num_heads + head) * group + g) * head_dim;
              for (int64_t d = 0; d < head_dim; ++d) acc[d] += weight * (ToF32(v[d]) * v_scale);
            }
          }
        }
      }
    }
  }
  for (int64_t row = 0; row < num_rows * heads_per_row; ++row) {
    float inverse = running_sum[row] > 0.0f ? 1.0f / running_sum[row] : 0.0f;
    if (p.sinks != nullptr) {  // the sink joins the sum only: rescale both to the larger of the two maxima
      const float sink = p.sinks[row % heads_per_row];
      const float top = running_sum[row] > 0.0f ? std::max(running_max[row], sink) : sink;
      const float rescale = running_sum[row] > 0.0f ? ExpNonPositive(running_max[row] - top) : 0.0f;
      inverse = rescale / (running_sum[row] * rescale + ExpNonPositive(sink - top));
    }
    float* acc = out + row * head_dim;
    for (int64_t d = 0; d < head_dim; ++d) acc[d] *= inverse;
  }
}

// The rows in work items: consecutive rows of one sequence at consecutive positions, at most `max_rows` a block (a
// decode row is a block of its own); a run of padding rows (position < 0) is one block that only writes zeros.
std::vector<Block> SplitIntoBlocks(const Problem& p, int64_t max_rows) {
  std::vector<Block> blocks;
  for (int64_t row = 0; row < p.num_rows;) {
    int64_t num_rows = 1;
    if (p.positions[row] < 0) {
      while (row + num_rows < p.num_rows && p.positions[row + num_rows] < 0) ++num_rows;
    } else {
      while (num_rows < max_rows && row + num_rows < p.num_rows && p.row_seqs[row + num_rows] == p.row_seqs[row] &&
             p.positions[row + num_rows] == p.positions[row] + num_rows) {
        ++num_rows;
      }
    }
    blocks.push_back(Block{row, num_rows});
    row += num_rows;
  }
  return blocks;
}

// The items of one call, shared with the pool's tasks: a task that starts only after the call returned finds no
// item left and touches nothing else, so the call never waits for a task to start (the pool may be busy, or be
// this very thread); it waits until every item is done.
struct SharedWork {
  Problem problem;
  std::vector<Block> blocks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> num_done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

template <typename T, int kHeadDim>
void WorkOn(SharedWork& work) {
  const Problem& problem = work.problem;
  const int64_t num_items = static_cast<int64_t>(work.blocks.size());
  // Each thread claims its next item before working on the current one, so the current one's last page can
  // prefetch the next one's first.
  int64_t item = work.next.fetch_add(1);
  while (item < num_items) {
    const int64_t upcoming = work.next.fetch_add(1);
    AttendBlock<T, kHeadDim>(problem, work.blocks[item],
                             upcoming < num_items ? FirstPage<T>(problem, work.blocks[upcoming]) : nullptr);
    if (work.num_done.fetch_add(1) + 1 == num_items) {
      std::lock_guard<std::mutex> lock(work.mutex);
      work.all_done.notify_all();
    }
    item = upcoming;
  }
}

// Runs every block once, on the caller and on XLA's intra-op threads.
template <typename T, int kHeadDim>
void RunAll(const Problem& problem, ffi::ThreadPool& pool) {
  auto work = std::make_shared<SharedWork>();
  work->problem = problem;
  const int64_t heads_per_row = problem.num_kv_heads * problem.group;
  const int64_t max_rows = std::min({kMaxBlockRows, kMaxRows / heads_per_row,
                                     kMaxWeights / (problem.group * problem.page_size)});
  work->blocks = SplitIntoBlocks(problem, max_rows);
  const int64_t num_items = static_cast<int64_t>(work->blocks.size());
  const int64_t num_helpers = std::min<int64_t>(pool.num_threads(), num_items / 4);
  for (int64_t i = 0; i < num_helpers; ++i) {
    pool.Schedule([work]() { WorkOn<T, kHeadDim>(*work); });
  }
  WorkOn<T, kHeadDim>(*work);
  std::unique_lock<std::mutex> lock(work->mutex);
  work->all_done.wait(lock, [&]() { return work->num_done.load() == num_items; });
}

// The common head sizes get loops of fixed length; any other runs the same code with head_dim read at run time.
// (Fixing the group size too was measured: no faster, and four times the build time.)
template <typename T>
void RunForShape(const Problem& problem, ffi::ThreadPool& pool) {
  switch (problem.head_dim) {
    case 64: RunAll<T, 64>(problem, pool); break;
    case 128: RunAll<T, 128>(problem, pool); break;
    default: RunAll<T, 0>(problem, pool); break;
  }
}

ffi::Error PagedDecodeImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer kv_pages,
                           ffi::Buffer<ffi::S32> positions, ffi::Buffer<ffi::S32> row_seqs,
                           ffi::Buffer<ffi::S32> block_tables, ffi::Buffer<ffi::F32> sinks, int64_t sliding_window,
                           float soft_cap,
                           ffi::ResultBuffer<ffi::F32> out) {
  auto q_dims = q.dimensions();
  auto kv_dims = kv_pages.dimensions();
  auto table_dims = block_tables.dimensions();
  if (q_dims.size() != 4 || kv_dims.size() != 4 || table_dims.size() != 2) {
    return ffi::Error::InvalidArgument("paged_decode: q must be 4-D, kv_pages 4-D, block_tables 2-D");
  }
  Problem problem{q.typed_data(), kv_pages.untyped_data(), positions.typed_data(), row_seqs.typed_data(),
                  block_tables.typed_data(), sinks.element_count() > 0 ? sinks.typed_data() : nullptr,
                  out->typed_data(), q_dims[0], table_dims[0], q_dims[1], q_dims[2],
                  q_dims[3], kv_dims[0], kv_dims[1], table_dims[1], sliding_window, soft_cap, 0};
  const auto type = kv_pages.element_type();
  const bool quantized = type == ffi::S8 || type == ffi::U8;
  problem.row_width = quantized ? RowWidth<int8_t>(problem.head_dim) : problem.head_dim;
  const size_t num_rows = static_cast<size_t>(q_dims[0]);
  if (kv_dims[2] != 2 * problem.num_kv_heads || kv_dims[3] != problem.row_width || table_dims[0] < 1 ||
      positions.element_count() != num_rows || row_seqs.element_count() != num_rows ||
      (sinks.element_count() != 0 &&
       sinks.element_count() != static_cast<size_t>(problem.num_kv_heads * problem.group))) {
    return ffi::Error::InvalidArgument(
        "paged_decode: kv_pages, positions, row_seqs, block_tables or sinks do not match q");
  }
  if (problem.group > kMaxGroup || problem.page_size > kMaxPageSize ||
      problem.group * problem.num_kv_heads > kMaxRows || problem.group * problem.page_size > kMaxWeights) {
    return ffi::Error::InvalidArgument("paged_decode: group, page size or q heads above the kernel's limits");
  }
  switch (type) {
    case ffi::F32: RunForShape<float>(problem, pool); break;
    case ffi::BF16:
    case ffi::U16:  // bfloat16 bits: the pool XLA:CPU can scatter into in place
      RunForShape<uint16_t>(problem, pool);
      break;
    case ffi::S8: RunForShape<int8_t>(problem, pool); break;   // int8 codes + scales
    case ffi::U8: RunForShape<uint8_t>(problem, pool); break;  // float8_e4m3fn codes (bits) + scales
    default:
      return ffi::Error::InvalidArgument(
          "paged_decode: kv_pages must be float32, bfloat16 (or its uint16 bits), or int8 / fp8 (uint8) codes");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxpagedPagedDecode, PagedDecodeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("sliding_window")
                                  .Attr<float>("soft_cap")
                                  .Ret<ffi::Buffer<ffi::F32>>());

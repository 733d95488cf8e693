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
//   weights      1 or 2 of them (kMaxWeights; a MoE's gate and up share a call), each [groups, inner, outer]
//                row-major, as checkpoints and the model store them, or packed into panels [groups, ceil(outer / 128),
//                inner, 128] (the last one zero-padded; told apart by rank): f32, bf16 (widened to float32 in
//                registers by a shift) or s8 (widened by VPMOVSXBD and VCVTDQ2PS), all of one type.
//   scales       optional, one per weight, f32 [groups, outer]: group i's output column j is multiplied by
//                scales[i, j] (weight-only int8), once, on the finished float32 sum.
// Results: one f32 [rows, outer] per weight, float32 sums.
//
// Work: groups of up to 4 rows on weights as stored (every decode group) stream through their weight rows in
// chunks (grouped_stream.h); other groups, and packed panels, run register tiles over runs of kRunColumns columns
// (grouped_tiles.h). Every item of every weight of the call is handed out through one atomic counter to the caller
// and XLA's intra-op threads (packed_matmul.cc's scheme); items of one group run together, so a group's row block
// stays in cache while its weight streams by.

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

#include "grouped_elements.h"
#include "grouped_stream.h"
#include "grouped_tiles.h"
#include "packed_tiles.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using grouped_elements::Bfloat16;
using grouped_elements::Float32;
using grouped_elements::Int8;
using grouped_tiles::kRunColumns;
using grouped_tiles::Problem;

// Rows per block: a block's rows of x (72 x 2,048 floats, Qwen3-30B-A3B's hidden, 576 KiB) stay in L2 while the
// group's weight streams by. A decode's group (a few rows) is one block, so its weight is read once per call.
constexpr int64_t kBlockRows = 72;
// Weights per call: gate and up of a mixture of experts share one call (the same rows of x, one pass of the threads).
constexpr int kMaxWeights = 2;

// An item of weight `weight` of the call. A tile item: rows [first_row, end_row) of `group`, the kRunColumns columns
// from `column`. A streamed item (stream >= 0, grouped_stream.h): chunk `chunk` of streamed group `stream`, weight
// rows [first_inner, end_inner).
struct Item {
  int weight;
  int64_t group, first_row, end_row, column;
  int64_t stream = -1, chunk = 0, first_inner = 0, end_inner = 0;
};

// The items of one call, shared with the pool's tasks: a task that starts after the call returned finds no item left
// and touches nothing else, so the call never waits for a task to start, only for every item to be done.
template <typename T>
struct SharedWork {
  Problem<T> problems[kMaxWeights];
  std::vector<Item> items;
  std::unique_ptr<grouped_stream::StreamedGroup[]> streamed;
  std::vector<float> partials;  // the streamed chunks' sums, where a group has more than one chunk
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> num_done{0};
  std::mutex mutex;
  std::condition_variable all_done;
};

// The first weight bytes a streamed item reads (nullptr for a tile item or past the last item).
template <typename T>
const void* FirstBytes(const SharedWork<T>& work, int64_t index) {
  if (index >= static_cast<int64_t>(work.items.size()) || work.items[index].stream < 0) return nullptr;
  const Item& item = work.items[index];
  const Problem<T>& p = work.problems[item.weight];
  return p.weights + item.group * p.group_stride + item.first_inner * p.outer;
}

template <typename T>
void WorkOn(SharedWork<T>& work) {
  const int64_t num_items = static_cast<int64_t>(work.items.size());
  // Each thread claims its next item before working on the current one, so that a streamed chunk's last rows can
  // ask for the next chunk's first (packed_matmul.cc does the same with its panels).
  int64_t index = work.next.fetch_add(1);
  for (int64_t following = 0; index < num_items; index = following) {
    following = work.next.fetch_add(1);
    const Item& item = work.items[index];
    const Problem<T>& p = work.problems[item.weight];
    if (item.stream >= 0) {
      grouped_stream::RunChunk<T>(work.streamed[item.stream], item.chunk, item.first_inner, item.end_inner, p.x,
                                  p.inner, p.weights, p.group_stride, p.outer, p.scales, p.out,
                                  work.partials.data(), FirstBytes(work, following));
    } else {
      grouped_tiles::MultiplyRun(p, item.group, item.first_row, item.end_row, item.column);
    }
    if (work.num_done.fetch_add(1) + 1 == num_items) {
      std::lock_guard<std::mutex> lock(work.mutex);
      work.all_done.notify_all();
    }
  }
}

// Weight w's problem from its operands, or an error naming what does not fit.
template <typename T, ffi::DataType kWeightType>
ffi::Error MakeProblem(const ffi::Buffer<ffi::F32>& x, int64_t num_groups, const ffi::Buffer<kWeightType>& weights,
                       const float* scales, size_t num_scales, ffi::Result<ffi::Buffer<ffi::F32>>& out,
                       Problem<T>& problem) {
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
  const int64_t inner = x_dims[1], outer = out_dims[1];
  if (weight_dims[0] != num_groups) {
    return ffi::Error::InvalidArgument("grouped_matmul: group_sizes must hold one size per group of the weights");
  }
  if (scales != nullptr && num_scales != static_cast<size_t>(num_groups * outer)) {
    return ffi::Error::InvalidArgument("grouped_matmul: scales must be [groups, outer]");
  }
  const int64_t panel_columns = panels ? kRunColumns : std::max<int64_t>(outer, 1);
  const int64_t panel_stride = inner * panel_columns;
  const int64_t group_stride = panels ? weight_dims[1] * panel_stride : inner * outer;
  problem = Problem<T>{{x.typed_data(), scales, out->typed_data(), inner, outer}, weights.typed_data(), panel_columns,
                       group_stride, panel_stride};
  return ffi::Error::Success();
}

// Every item of weight w: groups of few rows on weights as stored stream in chunks (grouped_stream.h), the others
// (and every group of packed panels) take register tiles. Zeroes the padding rows' results.
template <typename T>
void AddItems(SharedWork<T>& work, int w, const int32_t* sizes, int64_t num_groups, bool panels, int64_t rows,
              int64_t num_chunks, int64_t& stream, int64_t& partial_floats) {
  const Problem<T>& p = work.problems[w];
  int64_t start = 0;
  for (int64_t group = 0; group < num_groups && start < rows; ++group) {
    const int64_t end = std::min(rows, start + std::max<int64_t>(sizes[group], 0));
    if (grouped_stream::Streams(end - start, panels, p.outer) && p.inner > 0) {
      work.streamed[stream].Start(group, start, end - start, num_chunks, partial_floats);
      partial_floats += num_chunks > 1 ? num_chunks * (end - start) * p.outer : 0;
      for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
        work.items.push_back(Item{w, group, start, end, 0, stream, chunk, p.inner * chunk / num_chunks,
                                  p.inner * (chunk + 1) / num_chunks});
      }
      ++stream;
    } else if (p.inner > 0) {
      for (int64_t first = start; first < end; first += kBlockRows) {
        for (int64_t column = 0; column < p.outer; column += kRunColumns) {
          work.items.push_back(Item{w, group, first, std::min(end, first + kBlockRows), column});
        }
      }
    } else {
      std::fill(p.out + start * p.outer, p.out + end * p.outer, 0.0f);  // an empty sum
    }
    start = end;
  }
  // The padding rows' results are zeros: finite, whatever runs on them next.
  std::fill(p.out + start * p.outer, p.out + rows * p.outer, 0.0f);
}

// Checks the operands and runs every weight's items on the caller and on XLA's intra-op threads. Operands: x,
// group_sizes, then 1 to kMaxWeights weights (the remaining arguments, one per result), then optionally one scales
// operand per weight. kWeightType: the weights' element type; T: how they are loaded.
template <typename T, ffi::DataType kWeightType>
ffi::Error Run(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> group_sizes,
               ffi::RemainingArgs weights_and_scales, ffi::RemainingRets outs) {
  const int num_weights = static_cast<int>(outs.size());
  const int num_args = static_cast<int>(weights_and_scales.size());
  if (num_weights < 1 || num_weights > kMaxWeights || (num_args != num_weights && num_args != 2 * num_weights)) {
    return ffi::Error::InvalidArgument("grouped_matmul: 1 or 2 weights, one result each, and either no scales or "
                                       "one scales operand per weight");
  }
  const int64_t num_groups = static_cast<int64_t>(group_sizes.element_count());
  const int64_t rows = x.dimensions().size() == 2 ? x.dimensions()[0] : 0;
  auto work = std::make_shared<SharedWork<T>>();
  bool panels[kMaxWeights] = {};
  int64_t num_streamed = 0, stream_inner = 0, stream_outer = 0;
  for (int w = 0; w < num_weights; ++w) {
    auto weights = weights_and_scales.get<ffi::Buffer<kWeightType>>(w);
    auto out = outs.get<ffi::Buffer<ffi::F32>>(w);
    if (weights.has_error()) return weights.error();
    if (out.has_error()) return out.error();
    const float* scales = nullptr;
    size_t num_scales = 0;
    if (num_args == 2 * num_weights) {
      auto scale_buffer = weights_and_scales.get<ffi::Buffer<ffi::F32>>(num_weights + w);
      if (scale_buffer.has_error()) return scale_buffer.error();
      scales = scale_buffer->typed_data(), num_scales = scale_buffer->element_count();
    }
    ffi::Error made = MakeProblem<T, kWeightType>(x, num_groups, *weights, scales, num_scales, *out,
                                                  work->problems[w]);
    if (made.failure()) return made;
    panels[w] = weights->dimensions().size() == 4;
    const Problem<T>& p = work->problems[w];
    int64_t counted = 0;
    for (int64_t group = 0, start = 0; group < num_groups && start < rows; ++group) {
      const int64_t end = std::min(rows, start + std::max<int64_t>(group_sizes.typed_data()[group], 0));
      counted += grouped_stream::Streams(end - start, panels[w], p.outer) ? 1 : 0;
      start = end;
    }
    num_streamed += counted;
    stream_inner = std::max(stream_inner, p.inner), stream_outer = std::max(stream_outer, p.outer);
  }
  const int64_t num_chunks = grouped_stream::Chunking(num_streamed, stream_inner, stream_outer,
                                                      sizeof(typename T::Element));
  work->streamed.reset(new grouped_stream::StreamedGroup[num_streamed]);
  int64_t stream = 0, partial_floats = 0;
  for (int w = 0; w < num_weights; ++w) {
    AddItems(*work, w, group_sizes.typed_data(), num_groups, panels[w], rows, num_chunks, stream, partial_floats);
  }
  work->partials.resize(partial_floats);
  const int64_t num_items = static_cast<int64_t>(work->items.size());
  if (num_items == 0) return ffi::Error::Success();
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

#define JAXPAGED_GROUPED_MATMUL_HANDLER(name, impl)                \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, impl,                        \
                                ffi::Ffi::Bind()                   \
                                    .Ctx<ffi::ThreadPool>()        \
                                    .Arg<ffi::Buffer<ffi::F32>>()  \
                                    .Arg<ffi::Buffer<ffi::S32>>()  \
                                    .RemainingArgs()               \
                                    .RemainingRets());

JAXPAGED_GROUPED_MATMUL_HANDLER(JaxpagedGroupedMatmul, GroupedMatmulImpl)
JAXPAGED_GROUPED_MATMUL_HANDLER(JaxpagedGroupedMatmulBfloat16, GroupedMatmulBfloat16Impl)
JAXPAGED_GROUPED_MATMUL_HANDLER(JaxpagedGroupedMatmulInt8, GroupedMatmulInt8Impl)

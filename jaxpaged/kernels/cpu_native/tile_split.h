// How a block of rows is cut into register tiles, for the panel matmuls (packed_matmul.cc, vnni_matmul.cc).
#ifndef JAXPAGED_CPU_NATIVE_TILE_SPLIT_H_
#define JAXPAGED_CPU_NATIVE_TILE_SPLIT_H_

#include <algorithm>
#include <cstdint>

namespace tile_split {

// Calls visit(row, num_rows, tile, num_tiles) for each tile of rows [first, end), for a register tile of at most
// `tile_rows` rows (num_rows is 1 to tile_rows; `tile` and `num_tiles` let the tiles share fetching panels ahead).
// The rows are split into the fewest tiles, of sizes that differ by at most one row (a decode's 64 rows as 4 x 11 +
// 2 x 10 at 12-row tiles), so no row is multiplied twice. Where that would make tiles smaller than tile_rows - 2 (at
// that size a tile still has enough accumulators to cover the FMA latency), the rows left over after the whole tiles
// are covered by one more whole tile ending at `end`, which overlaps the tile before it: each tile writes whole sums,
// so rows computed twice get the same values twice. (A 4-row tile has 8 accumulators, too few to cover the FMA
// latency, and the same weight loads as a whole tile: it ran at about half the FMA rate.) The 64 rows of a decode step
// took 72 rows of work with overlapping tiles alone, 12.5 % more than the even split. Only a block smaller than a
// tile takes a smaller tile otherwise.
// `smallest_even`: the smallest tile the even split may use (default tile_rows - 2; a kernel whose instruction's
// latency a smaller tile still covers passes less).
template <typename Visit>
inline void ForEachTile(int64_t first, int64_t end, int64_t tile_rows, Visit visit, int64_t smallest_even = -1) {
  const int64_t num_rows = end - first;
  if (num_rows <= tile_rows) {
    visit(first, num_rows, int64_t{0}, int64_t{1});
    return;
  }
  const int64_t num_tiles = (num_rows + tile_rows - 1) / tile_rows;
  const int64_t smaller = num_rows / num_tiles, num_larger = num_rows % num_tiles;
  if (smaller >= (smallest_even < 0 ? tile_rows - 2 : smallest_even)) {
    int64_t row = first;
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
      const int64_t rows = smaller + (tile < num_larger ? 1 : 0);
      visit(row, rows, tile, num_tiles);
      row += rows;
    }
    return;
  }
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    visit(std::min(first + tile * tile_rows, end - tile_rows), tile_rows, tile, num_tiles);
  }
}

}  // namespace tile_split

#endif  // JAXPAGED_CPU_NATIVE_TILE_SPLIT_H_

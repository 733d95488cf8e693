"""The TPU kernel's visit schedule: which (row tile, group) pair each grid step multiplies, built on device.

Rows are sorted by group, so a row tile of `row_tile` rows holds the tail of one group, whole groups, and the head
of another. The kernel visits every (row tile, non-empty group) pair that overlaps, in row order, then every tile
past the last group's rows once (to write its padding zeros), then idles: the grid is static (the most visits any
group sizes can need: tiles + groups - 1), the number of visits used is not.

Why the order: visits of one row tile are consecutive, so its output block stays in VMEM until the last group in it
has written its rows; visits of one group are consecutive, so with the whole contraction in one block its weight tile
is fetched once per output column tile, however many row tiles the group spans. An idle or padding visit names the
same group as the visit before it, so Pallas sees an unchanged weight block index and fetches nothing: empty groups
are never read (the one exception: when every group is empty, the first step's weight tile of the last group).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from pallas_kernels.pytree import register_pytree_dataclass

HAS_GROUP = 1
"""Visit flag: the visit multiplies a group's rows (else it pads or idles)."""
FIRST_OF_TILE = 2
"""Visit flag: the first visit of its row tile, which zeroes the output block before any group writes."""


@register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class VisitSchedule:
    """Scalar-prefetched arrays that drive the kernel's grid (one entry per visit, padded to the static bound)."""

    group_ids: Int[Array, " visits"]
    """The group whose weights a visit multiplies (a padding or idle visit repeats the previous one's)."""
    row_tiles: Int[Array, " visits"]
    """The row tile (of lhs and the output) a visit reads and writes."""
    flags: Int[Array, " visits"]
    """HAS_GROUP | FIRST_OF_TILE bits."""
    group_offsets: Int[Array, " groups_plus_1"]
    """Row offsets of the groups: group i owns rows [group_offsets[i], group_offsets[i + 1])."""

    def arrays(self) -> tuple[jax.Array, ...]:
        """The arrays in the order the kernel's scalar-prefetch refs take them."""
        return self.group_ids, self.row_tiles, self.flags, self.group_offsets


def max_visits(num_row_tiles: int, num_groups: int) -> int:
    """The most visits any group sizes need: every tile once, plus one per group boundary falling inside a tile."""
    return num_row_tiles + max(num_groups - 1, 0)


def visit_schedule(group_sizes: Int[Array, " groups"], num_rows: int, num_row_tiles: int,
                   row_tile: int) -> VisitSchedule:
    """The schedule for `num_rows` real rows in `num_row_tiles` tiles; sizes past num_rows are clipped to it."""
    num_groups = group_sizes.shape[0]
    ends = jnp.minimum(jnp.cumsum(jnp.maximum(group_sizes, 0)), num_rows).astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), ends[:-1]])
    non_empty = ends > starts
    first_tile = starts // row_tile
    last_tile = (ends - 1) // row_tile
    visits_per_group = jnp.where(non_empty, last_tile - first_tile + 1, 0)
    visits_before_group = jnp.cumsum(visits_per_group) - visits_per_group
    num_group_visits = visits_per_group.sum()
    covered_tiles = (ends[-1] + row_tile - 1) // row_tile  # tiles holding at least one real row
    num_active = num_group_visits + num_row_tiles - covered_tiles
    last_group = jnp.max(jnp.where(non_empty, jnp.arange(num_groups), 0))

    visit = jnp.arange(max_visits(num_row_tiles, num_groups), dtype=jnp.int32)
    has_group = visit < num_group_visits
    group_of_visit = jnp.searchsorted(visits_before_group + visits_per_group, visit, side="right")
    group_of_visit = jnp.where(has_group, jnp.minimum(group_of_visit, num_groups - 1), last_group)
    group_tile = first_tile[group_of_visit] + visit - visits_before_group[group_of_visit]
    padding_tile = covered_tiles + visit - num_group_visits
    idle_tile = jnp.where(covered_tiles < num_row_tiles, num_row_tiles - 1, last_tile[last_group])
    row_tiles = jnp.where(has_group, group_tile, jnp.where(visit < num_active, padding_tile, idle_tile))
    previous_tile = jnp.concatenate([jnp.full(1, -1, jnp.int32), row_tiles[:-1]])
    first_of_tile = (visit < num_active) & (row_tiles != previous_tile)
    flags = jnp.where(has_group, HAS_GROUP, 0) | jnp.where(first_of_tile, FIRST_OF_TILE, 0)
    return VisitSchedule(group_of_visit.astype(jnp.int32), row_tiles.astype(jnp.int32), flags.astype(jnp.int32),
                         jnp.concatenate([jnp.zeros(1, jnp.int32), ends]))

"""ZeroPadded: a host weight seen with zeros appended, cut block by block as it is placed (never materialised
whole), and HostWeight, what the start-up plan and placement take as a host weight."""

from typing import Any, Union

import numpy as np


class ZeroPadded:
    """`source` seen with zeros appended along its axes up to `shape`: indexing by slices (a sharding's index)
    gives that block, zero-filled past the source; the padded whole is never materialised."""

    def __init__(self, source: Any, shape: tuple[int, ...]):
        if len(shape) != source.ndim or any(new < old for new, old in zip(shape, source.shape)):
            raise ValueError(f"padded shape {shape} must extend every axis of {source.shape}")
        self.source, self.shape, self.dtype, self.ndim = source, tuple(shape), source.dtype, source.ndim

    def __getitem__(self, index: Any) -> np.ndarray:
        """The block `index` (slices of step 1, or Ellipsis / fewer slices for whole axes) of the padded array."""
        items = index if isinstance(index, tuple) else (index,)
        if items and items[-1] is Ellipsis:
            items = items[:-1]
        items = items + (slice(None),) * (self.ndim - len(items))
        block, source, target = [], [], []
        for item, size, stored in zip(items, self.shape, self.source.shape):
            if not isinstance(item, slice):
                raise TypeError(f"ZeroPadded takes slices, got {item!r}")
            start, stop, step = item.indices(size)
            if step != 1:
                raise TypeError(f"ZeroPadded takes slices of step 1, got {item!r}")
            block.append(stop - start)
            source.append(slice(min(start, stored), min(stop, stored)))
            target.append(slice(0, max(0, min(stop, stored) - start)))
        out = np.zeros(block, self.dtype)
        out[tuple(target)] = self.source[tuple(source)]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The whole padded array (tests; placement takes blocks)."""
        whole = self[...]
        return whole if dtype is None else whole.astype(dtype)


HostWeight = Union[np.ndarray, ZeroPadded]
"""A host weight before placement: an array (often memory-mapped), or a zero-padded view of one (TPU experts:
runner/expert_lanes.py). Both have shape, dtype, ndim and slicing, all placement and the plan read."""

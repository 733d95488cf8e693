"""Wall-clock timing of a repeated call: the one loop behind the roofline, the dtype probe and the benchmarks."""

import time
from collections.abc import Callable


def call_seconds(function: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls, after one untimed call (it compiles, pages memory in and fills caches).
    `function` must return only once its work is done (block_until_ready on device results)."""
    function()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return seconds

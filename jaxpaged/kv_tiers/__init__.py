"""KV tiers below the device pool: evicted prefix-cache blocks live on in host memory, then on local disk.

Keyed by the block's chain hash within a layout fingerprint (model, dtype, block size, KV layout, sharding);
see tiers.py for how they fit together and core/lower_tiers.py for what the scheduler sees of them.
"""

from .fingerprint import layout_fingerprint, weights_sample_digest
from .tier_stats import TierStats
from .tiers import KVTiers

__all__ = ["KVTiers", "TierStats", "layout_fingerprint", "weights_sample_digest"]

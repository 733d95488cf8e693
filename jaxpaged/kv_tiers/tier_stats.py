"""TierStats: what one KV tier holds and has moved, for the engine stats and /metrics."""

import dataclasses


@dataclasses.dataclass
class TierStats:
    """One tier's gauges and cumulative counters (bytes summed over the tensor-parallel shards)."""

    hit_blocks: int = 0
    """Full blocks of admitted requests served from this tier (cumulative; 0 for the device, whose hits include
    token-granular copies: see hit_tokens)."""
    hit_tokens: int = 0
    """Prompt tokens of admitted requests served from this tier (cumulative; filled in by the engine)."""
    bytes_in: int = 0
    """Bytes written into this tier: offloads from the tier above, promotions from the one below (cumulative; the
    device: loaded from the tiers below)."""
    bytes_out: int = 0
    """Bytes read out of this tier towards the device (cumulative; the device: offloaded to the tiers below)."""
    bytes_used: int = 0
    """Bytes the tier holds now."""
    capacity_bytes: int = 0
    """The tier's bound."""
    num_blocks: int = 0
    """Blocks the tier holds now."""
    corrupt_entries: int = 0
    """Entries that failed their checksum or were cut short, and were dropped as misses (cumulative; disk)."""

"""Ragged paged attention over the runner's interleaved-K/V page layout, and the KV page write."""

from pallas_kernels.ragged_paged_attention.dispatch import (
    ATTENTION_BACKENDS,
    ragged_paged_attention,
    resolve_attention_backend,
    write_kv,
)
from pallas_kernels.ragged_paged_attention.reference import (
    ragged_paged_attention_reference,
    write_kv_pages,
)

__all__ = ["ATTENTION_BACKENDS", "ragged_paged_attention", "ragged_paged_attention_reference",
           "resolve_attention_backend", "write_kv", "write_kv_pages"]

"""Ragged paged attention over the runner's paged KV cache (kv_layout.py: interleaved, or packed for TPU), and
the KV page write.

metadata.py: the AttentionMetadata pytree and the shared vocabulary; spec.py: the plain reference;
xla.py: the CPU path; tpu.py / gpu.py: the Pallas kernels; dispatch.py: the switch the model calls.
"""

from jaxpaged.kernels.ragged_paged_attention.dispatch import (
    ATTENTION_BACKENDS,
    ragged_paged_attention,
    resolve_attention_backend,
    write_kv,
)
from jaxpaged.kernels.ragged_paged_attention.kv_layout import KVPages
from jaxpaged.kernels.ragged_paged_attention.metadata import AttentionMetadata, empty_attention_metadata
from jaxpaged.kernels.ragged_paged_attention.xla import ragged_paged_attention_xla, write_kv_pages

__all__ = ["ATTENTION_BACKENDS", "AttentionMetadata", "KVPages", "empty_attention_metadata", "ragged_paged_attention",
           "ragged_paged_attention_xla", "resolve_attention_backend", "write_kv", "write_kv_pages"]

"""The layout fingerprint: everything besides the tokens that decides what a stored KV block's bytes mean.

A chain hash says which tokens a block holds; the fingerprint says how their K/V were computed and laid out.
Entries are only ever read back under the same fingerprint, so a different model, dtype, KV format
(kv_cache_dtype), block size, KV layout or shard of a tensor-parallel split never sees another's bytes. The weights
count by a sample of their values (a fine-tune keeps the name and config.json but changes every tensor), not by a
digest of gigabytes.
"""

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

FORMAT_VERSION = 2
"""Bumped whenever the stored bytes or the file format change meaning."""


WEIGHT_SAMPLE_VALUES = 64
"""Values taken from each end of every parameter for weights_sample_digest."""


def weights_sample_digest(params: Mapping[str, np.ndarray]) -> str:
    """A digest of the first and last WEIGHT_SAMPLE_VALUES values of every parameter, in name order: reads a few
    KiB of a memory-mapped checkpoint, and tells a fine-tune from its base."""
    digest = hashlib.sha256()
    for name in sorted(params):
        flat = np.asarray(params[name]).reshape(-1)
        digest.update(name.encode() + str(flat.dtype).encode() + str(flat.size).encode())
        digest.update(np.ascontiguousarray(flat[:WEIGHT_SAMPLE_VALUES]).tobytes())
        digest.update(np.ascontiguousarray(flat[-WEIGHT_SAMPLE_VALUES:]).tobytes())
    return digest.hexdigest()


def layout_fingerprint(model_name: str, model_config: dict[str, Any], dtype: str, block_size: int, kv_layout: str,
                       block_shape: tuple[int, ...], tensor_parallel_size: int, shard_index: int,
                       weights_digest: str = "", kv_cache_dtype: str = "auto",
                       kv_groups: tuple[tuple[Optional[int], tuple[int, ...]], ...] = ()) -> str:
    """A 32-hex-digit digest of the fields (model_config: the checkpoint's config.json, whose fields decide the
    K/V as much as the weights do; block_shape: one block's per-shard array shape, layers first;
    weights_digest: weights_sample_digest of the parameters; kv_cache_dtype: EngineConfig's, how K/V are stored,
    so an int8 tier is never read by a bfloat16 engine nor an fp8 one; kv_groups: with KV cache groups, each
    group's (sliding window or None, layer ids), which decide whose layers a block's slots hold; () without groups,
    leaving the fingerprints of before unchanged)."""
    fields = {"format": FORMAT_VERSION, "model": model_name, "config": model_config, "weights": weights_digest,
              "dtype": dtype, "kv_cache_dtype": kv_cache_dtype,
              "block_size": block_size, "kv_layout": kv_layout, "block_shape": list(block_shape),
              "tensor_parallel_size": tensor_parallel_size, "shard_index": shard_index}
    if kv_groups:
        fields["kv_groups"] = [[window, list(layers)] for window, layers in kv_groups]
    encoded = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:32]

"""The layout fingerprint: everything besides the tokens that decides what a stored KV block's bytes mean.

A chain hash says which tokens a block holds; the fingerprint says how their K/V were computed and laid out.
Entries are only ever read back under the same fingerprint, so a different model, dtype, block size, KV layout
or shard of a tensor-parallel split never sees another's bytes.
"""

import hashlib
import json
from typing import Any

FORMAT_VERSION = 1
"""Bumped whenever the stored bytes or the file format change meaning."""


def layout_fingerprint(model_name: str, model_config: dict[str, Any], dtype: str, block_size: int, kv_layout: str,
                       block_shape: tuple[int, ...], tensor_parallel_size: int, shard_index: int) -> str:
    """A 32-hex-digit digest of the fields (model_config: the checkpoint's config.json, whose fields decide the
    K/V as much as the weights do; block_shape: one block's per-shard array shape, layers first)."""
    fields = {"format": FORMAT_VERSION, "model": model_name, "config": model_config, "dtype": dtype,
              "block_size": block_size, "kv_layout": kv_layout, "block_shape": list(block_shape),
              "tensor_parallel_size": tensor_parallel_size, "shard_index": shard_index}
    encoded = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(encoded).hexdigest()[:32]

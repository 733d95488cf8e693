"""A multi-host job's processes must build runners of the same shapes: every step, block copy and broadcast is a
collective whose shapes come from them. Different engine flags on one host (say --disable-hybrid-kv-cache-manager, or
another max_model_len) would otherwise fail deep in gloo or XLA, or hang; this check fails at start-up instead, before
the first such collective (warm-up), naming the setting that differs."""

import zlib

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxpaged.runner.step_inputs import StepInputBuilder

SIGNATURE_FIELDS = ("step buckets (max_num_batched_tokens, max_num_seqs)",
                    "KV cache groups (disable_hybrid_kv_cache_manager, the model's sliding windows)",
                    "block-table columns (max_model_len, block_size)",
                    "KV pool shape (num_kv_blocks, kv_cache_memory, kv_cache_dtype)",
                    "step input shapes")


def runner_signature(inputs: StepInputBuilder, pool_shape: tuple[int, ...]) -> np.ndarray:
    """What every process must agree on, as len(SIGNATURE_FIELDS) ints: bucket count, KV cache groups, block-table
    columns, and checksums of the pool's shape and of every bucket's step-input shapes."""
    buckets = inputs.ladder.buckets()
    shapes = [(bucket.num_tokens, bucket.num_seqs, tuple(leaf.shape for leaf in jax.tree.leaves(inputs.empty(bucket))))
              for bucket in buckets]
    return np.array([len(buckets), inputs.num_kv_groups, inputs.blocks_per_seq, _checksum(pool_shape),
                     _checksum(shapes)], np.int32)


def check_same_runners(own: np.ndarray, every: np.ndarray) -> None:
    """ValueError naming the first setting on which some process's runner differs from this one's (`every`: each
    process's runner_signature, one row each)."""
    for process, theirs in enumerate(np.asarray(every).reshape(-1, len(own))):
        for field, mine, other in zip(SIGNATURE_FIELDS, own, theirs):
            if mine != other:
                raise ValueError(f"multi-host: process {process} built a runner of other shapes than process "
                                 f"{jax.process_index()}'s: {field} differ ({int(other)} against {int(mine)}); start "
                                 f"every process with the same model and engine flags")


def check_processes_agree(inputs: StepInputBuilder, pool_shape: tuple[int, ...]) -> None:
    """On a multi-process job, compares this process's runner with every other's (one small all-gather; every
    process must call it at the same point); nothing on one process."""
    if jax.process_count() == 1:
        return
    own = runner_signature(inputs, pool_shape)
    check_same_runners(own, multihost_utils.process_allgather(own))


def _checksum(value: object) -> int:
    return zlib.crc32(repr(value).encode()) & 0x7FFFFFFF

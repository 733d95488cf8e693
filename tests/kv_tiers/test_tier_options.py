"""The tiers' options (byte sizes, errors naming the field, CLI flags), the load-or-recompute rule, and the layout
fingerprint."""

import argparse
from typing import Any

import pytest

from jaxpaged.checks import parse_byte_size
from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
from jaxpaged.config import CacheConfig, EngineConfig
from jaxpaged.kv_tiers import layout_fingerprint
from jaxpaged.runner.tier_transfer import TIER_TRANSFER_BATCH, min_blocks_worth_loading


@pytest.mark.parametrize("text, expected", [("8GiB", 8 * 2**30), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
                                            ("4096", 4096), (123, 123), ("2kib", 2048), ("0", 0)])
def test_byte_sizes(text, expected):
    assert parse_byte_size(text, "kv_offload_memory") == expected


@pytest.mark.parametrize("bad", ["lots", "8 parsecs", "-1GiB", 1.5, True, None])
def test_bad_byte_sizes_name_the_field(bad):
    with pytest.raises(ValueError, match="^kv_offload_memory: must be a number of bytes"):
        parse_byte_size(bad, "kv_offload_memory")


def test_cache_config_takes_sizes_and_refuses_tiers_without_prefix_caching():
    # Strings are what YAML and flags give; the config keeps ints.
    sizes: dict[str, Any] = dict(kv_offload_memory="2GiB", kv_offload_dir_max_bytes="1TB", kv_cache_memory="1GiB")
    cache = CacheConfig(kv_offload_dir="/tmp/x", **sizes)
    assert (cache.kv_offload_memory, cache.kv_offload_dir_max_bytes, cache.kv_cache_memory) == (
        2 * 2**30, 10**12, 2**30)
    assert cache.kv_offload_enabled and not CacheConfig().kv_offload_enabled
    with pytest.raises(ValueError, match="^kv_offload_memory: .*need enable_prefix_caching"):
        CacheConfig(kv_offload_memory=2**30, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="^kv_offload_dir: "):
        CacheConfig(kv_offload_dir="")
    with pytest.raises(ValueError, match="^kv_offload_min_load_blocks: "):
        CacheConfig(kv_offload_memory=1, kv_offload_min_load_blocks=0)
    with pytest.raises(ValueError, match="^kv_offload_dir_max_bytes: "):
        EngineConfig.from_options(kv_offload_dir_max_bytes="big")


def test_cli_flags_reach_the_config():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--kv-offload-memory", "8GiB", "--kv-offload-dir", "/data/kv",
                              "--kv-offload-dir-max-bytes", "100GiB", "--kv-offload-min-load-blocks", "2"])
    cache = EngineConfig.from_options(**engine_options_from_args(args)).cache
    assert (cache.kv_offload_memory, cache.kv_offload_dir, cache.kv_offload_dir_max_bytes,
            cache.kv_offload_min_load_blocks) == (8 * 2**30, "/data/kv", 100 * 2**30, 2)


def test_load_or_recompute():
    # Recomputing costs 1 ms per 16-token block; a batch of TIER_TRANSFER_BATCH blocks loads in 4 ms.
    assert min_blocks_worth_loading(4e-3, 1e-3 / 16, 16, 64) == 5  # 4 ms < 5 ms, not < 4 ms
    # A whole batch never pays off when one block's load costs more than a whole batch of recomputing.
    assert min_blocks_worth_loading(1.0, 1e-3 / 16, 16, 64) == 65
    assert min_blocks_worth_loading(1e-6, 1e-3 / 16, 16, 64) == 1
    # Past one batch, a second batch's cost counts from its first block.
    assert TIER_TRANSFER_BATCH == 16
    assert min_blocks_worth_loading(15.5e-3, 1e-3 / 16, 16, 64) == 16


def test_fingerprint_changes_with_every_field():
    fields: dict[str, Any] = dict(model_name="m", model_config={"hidden_size": 64}, dtype="float32", block_size=16,
                  kv_layout="interleaved", block_shape=(2, 16, 4, 16), tensor_parallel_size=1, shard_index=0)
    base = layout_fingerprint(**fields)
    assert layout_fingerprint(**fields) == base and len(base) == 32
    changes: dict[str, Any] = dict(model_name="m2", model_config={"hidden_size": 65}, dtype="bfloat16", block_size=32,
                   kv_layout="packed", block_shape=(2, 16, 2, 16), tensor_parallel_size=2, shard_index=1)
    for name, value in changes.items():
        assert layout_fingerprint(**(fields | {name: value})) != base, name

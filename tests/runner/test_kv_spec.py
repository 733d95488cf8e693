"""KVSpec is the one description of a KV block every reader takes (pool allocation, memory plan, tier transfers and the
tiers' fingerprint), and the KV pool allocates and copies exactly what it says."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.kv_cache import bytes_per_block, logical_bytes_per_block
from jaxpaged.runner.kv_pool import KVPool
from jaxpaged.runner.kv_spec import build_kv_spec
from jaxpaged.runner.memory_plan import plan_memory
from tests.runner.test_step_preparation import _model


def test_one_group_holds_every_layer_with_full_attention():
    """Today's models have one layer group: all layers, full attention, no window."""
    spec = build_kv_spec(_model(num_layers=3), 4, np.float32, "interleaved")
    (group,) = spec.groups
    assert group.layer_ids == (0, 1, 2) and group.attention == "full" and group.sliding_window is None


@pytest.mark.parametrize(("layout", "dtype", "row"), [("interleaved", np.float32, 16),
                                                      ("interleaved_bits", jnp.bfloat16, 16),
                                                      ("quantized", np.int8, 16 + 2)])
def test_the_pool_is_layers_by_blocks_by_pages_of_k_and_v_rows(layout, dtype, row):
    """[layers, blocks, block_size, 2 * kv_heads, head_dim (+ 2 scale bytes when quantized)], worked by hand."""
    spec = build_kv_spec(_model(num_layers=2, num_kv_heads=2, head_dim=16), 4, dtype, layout)
    assert spec.pool_shape(7) == (2, 7, 4, 4, row)
    assert spec.tier_block_shape == (2, 4, 4, row)


def test_a_tensor_parallel_shard_stores_its_heads_rows_of_every_block():
    """Split over 2 devices, one device's block holds half the K/V rows; its bytes are half the logical bytes."""
    model = _model(num_layers=2, num_kv_heads=2, head_dim=16)
    spec = build_kv_spec(model, 4, np.float32, "interleaved", num_shards=2, platform="cpu")
    assert spec.pool_shape(5) == (2, 5, 4, 4, 16)
    assert spec.tier_block_shape == (2, 4, 2, 16)
    assert spec.bytes_per_block_per_device == 2 * 4 * 2 * 16 * 4
    assert spec.logical_bytes_per_token * spec.block_size == logical_bytes_per_block(model, 4, np.float32)


def test_the_packed_layout_keeps_each_shards_rows_together():
    """The packed TPU layout stacks the shards' rows on axis -2: the whole page is num_shards shard pages."""
    model = _model(num_layers=1, num_kv_heads=4, head_dim=128)
    spec = build_kv_spec(model, 16, jnp.bfloat16, "packed", num_shards=2, platform="tpu")
    *_, rows, lanes = spec.group.page_shape
    assert lanes == 128 and spec.group.shard_page_shape == (rows // 2, 128)
    assert spec.bytes_per_block_per_device == bytes_per_block(model, 16, jnp.bfloat16, "tpu", "packed", 2)


def test_the_memory_plan_reads_the_same_bytes_as_the_spec():
    """plan_memory's per-block and per-token bytes are the spec's (one formula, not two)."""
    model = _model()
    spec = build_kv_spec(model, 4, np.float32, "interleaved")
    plan = plan_memory(model, 1000, 17, 4, 16, np.float32, 1, "interleaved")
    assert plan.kv_bytes_per_block_per_device == spec.bytes_per_block_per_device
    assert plan.kv_bytes_per_token == spec.logical_bytes_per_token


def test_the_pool_allocates_the_spec_and_copies_whole_blocks_in_every_layer():
    """A copy batch sets each destination block to its source in every layer; other blocks and the hook see it."""
    spec = build_kv_spec(_model(num_layers=2, num_kv_heads=2, head_dim=16), 4, np.float32, "interleaved")
    pool = KVPool(spec, 6, mesh_lib.rank_meshes(1, 1)[0])
    assert pool.cache.shape == spec.pool_shape(6) and pool.cache.dtype == spec.pool_dtype
    assert not np.asarray(pool.cache).any()
    pool.cache = jax.device_put(np.arange(pool.cache.size, dtype=np.float32).reshape(pool.cache.shape), pool.sharding)
    before = np.asarray(pool.cache)
    announced = []
    pool.before_copy = announced.append
    pool.apply_block_copies([(1, 3), (2, 5)])
    after = np.asarray(pool.cache)
    np.testing.assert_array_equal(after[:, 3], before[:, 1])
    np.testing.assert_array_equal(after[:, 5], before[:, 2])
    np.testing.assert_array_equal(after[:, [0, 1, 2, 4]], before[:, [0, 1, 2, 4]])
    assert len(announced) == 1 and announced[0][:2].tolist() == [[1, 3], [2, 5]]

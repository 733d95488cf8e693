"""The runner's host-side joints: bucket ladders, KV cache sizing and the padded step batch (prepare)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.config import CacheConfig, EngineConfig
from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.runner.buckets import Bucket, BucketLadder, token_ladder
from jaxpaged.runner.kv_cache import bytes_per_block, num_kv_blocks_for

BLOCK_SIZE = 4


def test_token_ladder_doubles_from_16_and_ends_at_the_budget():
    assert token_ladder(16) == [16]
    assert token_ladder(17) == [16, 17]
    assert token_ladder(100) == [16, 32, 64, 100]
    assert token_ladder(128) == [16, 32, 64, 128]


def test_bucket_ladder_picks_the_smallest_bucket_that_holds_the_step():
    ladder = BucketLadder(max_num_batched_tokens=100, max_num_seqs=24)
    assert ladder.buckets() == [Bucket(16, 16), Bucket(32, 24), Bucket(64, 24), Bucket(100, 24)]
    assert ladder.pick(1, 1) == Bucket(16, 16)
    assert ladder.pick(16, 16) == Bucket(16, 16)
    assert ladder.pick(17, 3) == Bucket(32, 24)
    assert ladder.pick(100, 24) == Bucket(100, 24)
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        ladder.pick(101, 1)
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        ladder.pick(50, 25)


def _model(num_layers=2, num_kv_heads=2, head_dim=16) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=100, hidden_size=64, intermediate_size=128,
                       num_layers=num_layers, num_q_heads=4, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=256, tie_word_embeddings=True)


def test_kv_sizing_counts_every_layer_k_and_v():
    model = _model()
    # 2 layers x 16 tokens x (K + V) x 2 heads x 16 dims x 4 bytes
    assert bytes_per_block(model, 16, np.float32) == 2 * 16 * 2 * 2 * 16 * 4
    per_block = bytes_per_block(model, 16, np.float32)
    assert bytes_per_block(model, 16, jnp.bfloat16) == per_block // 2
    assert num_kv_blocks_for(model, CacheConfig(kv_cache_memory=10 * per_block + 1), np.float32) == 10
    assert num_kv_blocks_for(model, CacheConfig(num_kv_blocks=7, kv_cache_memory=1), np.float32) == 7
    # Split over 2 devices, each holds one head of every block: the per-device budget holds 2x the blocks.
    assert num_kv_blocks_for(model, CacheConfig(kv_cache_memory=10 * per_block), np.float32, num_shards=2) == 20
    with pytest.raises(ValueError, match="kv_cache_memory: .* fewer than 2 blocks"):
        num_kv_blocks_for(model, CacheConfig(kv_cache_memory=per_block), np.float32)


def test_the_accelerator_default_pool_leaves_room_for_weights_not_placed_yet(monkeypatch):
    """The start-up plan sizes the pool before the weights are on the device: 0.6 of (limit - in use - the weights
    still to come), the budget the old order (weights first) measured."""
    import types

    from jaxpaged.runner import kv_cache

    model = _model()
    per_block = bytes_per_block(model, 16, np.float32)
    stats = {"bytes_limit": 1000 * per_block, "bytes_in_use": 100 * per_block}
    gpu = types.SimpleNamespace(platform="gpu", memory_stats=lambda: stats)
    monkeypatch.setattr(kv_cache.jax, "local_devices", lambda: [gpu])
    assert num_kv_blocks_for(model, CacheConfig(), np.float32) == int(0.6 * 900)
    assert num_kv_blocks_for(model, CacheConfig(), np.float32, pending_weight_bytes=400 * per_block) == int(0.6 * 500)
    stats["bytes_in_use"] += 400 * per_block  # the weights placed: the same pool
    assert num_kv_blocks_for(model, CacheConfig(), np.float32) == int(0.6 * 500)


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    from jaxpaged.runner.model_runner import ModelRunner
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(block_size=BLOCK_SIZE, num_kv_blocks=32, max_model_len=64,
                                       max_num_batched_tokens=32, max_num_seqs=8, dtype="float32",
                                       attention_backend="xla")
    return ModelRunner(load_model(str(tiny_model_dir)), config)  # no warm-up: prepare() compiles nothing


def _scheduled(tokens: list[int], start: int, blocks: list[int], sample: bool) -> ScheduledRequest:
    request = Request(f"r{start}-{len(tokens)}", list(range(1, start + len(tokens) + 1)))
    return ScheduledRequest(request, tokens, start, blocks, sample)


def test_prepare_pads_a_mixed_prefill_and_decode_step(runner):
    """A 6-token chunk from position 3 (not sampled), a decode at position 9 and a fresh 1-token prompt."""
    scheduled = [_scheduled([11, 12, 13, 14, 15, 16], 3, [5, 6, 7], sample=False),
                 _scheduled([21], 9, [8, 9, 10], sample=True),
                 _scheduled([31], 0, [4], sample=True)]
    bucket, batch = runner.prepare(SchedulerOutput(scheduled, 8, set(), set()))
    assert bucket == Bucket(16, 8)
    attention = batch.attention
    np.testing.assert_array_equal(batch.token_ids, [11, 12, 13, 14, 15, 16, 21, 31] + [0] * 8)
    np.testing.assert_array_equal(batch.positions[:8], [3, 4, 5, 6, 7, 8, 9, 0])
    # slot = block_ids[position // 4] * 4 + position % 4; padding writes the null block's slot 0.
    np.testing.assert_array_equal(attention.slot_mapping,
                                  [5 * 4 + 3, 6 * 4, 6 * 4 + 1, 6 * 4 + 2, 6 * 4 + 3, 7 * 4, 10 * 4 + 1, 4 * 4]
                                  + [0] * 8)
    np.testing.assert_array_equal(attention.kv_lens, [9, 10, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(attention.cu_q_lens, [0, 6, 7, 8, 8, 8, 8, 8, 8])
    np.testing.assert_array_equal(attention.num_seqs, [3])
    np.testing.assert_array_equal(attention.block_tables[:3, :3], [[5, 6, 7], [8, 9, 10], [4, 0, 0]])
    assert not attention.block_tables[3:].any() and attention.block_tables.shape == (8, 16)
    # Only sampled sequences get a row: their last token's row, in order; the rest point at row 0.
    np.testing.assert_array_equal(batch.sample_indices, [6, 7, 0, 0, 0, 0, 0, 0])


def test_prepare_fills_a_whole_bucket(runner):
    """32 tokens over 8 sequences: the largest bucket, no padding rows at all."""
    scheduled = [_scheduled([s] * 4, 4 * s, list(range(1, 2 * s + 3)), sample=True) for s in range(8)]
    bucket, batch = runner.prepare(SchedulerOutput(scheduled, 32, set(), set()))
    assert bucket == Bucket(32, 8)
    np.testing.assert_array_equal(batch.attention.cu_q_lens, np.arange(0, 33, 4))
    np.testing.assert_array_equal(batch.sample_indices, np.arange(3, 32, 4))
    np.testing.assert_array_equal(batch.attention.kv_lens, [4 * s + 4 for s in range(8)])

"""The start-up memory plan: hand-worked figures, and the refusals that name the option to change."""

import numpy as np
import pytest

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.registry import read_model_config
from jaxpaged.runner.memory_plan import MemoryPlan, check_weights_fit, plan_memory, weight_bytes_per_device


def tiny_model() -> ModelConfig:
    return read_model_config(dict(
        architectures=["LlamaForCausalLM"], vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, tie_word_embeddings=True))


def test_weight_bytes_split_only_where_tensor_parallel_splits():
    model = tiny_model()
    params = {"embed": np.zeros((64, 32), np.float32), "final_norm": np.zeros(32, np.float32),
              "layers.q_proj": np.zeros((2, 32, 32), np.float32), "layers.input_norm": np.zeros((2, 32), np.float32)}
    total = (64 * 32 + 32 + 2 * 32 * 32 + 2 * 32) * 4
    assert weight_bytes_per_device(params, model, 1, np.float32) == total
    # tp=2 halves the embedding and q_proj; norms stay whole on each device. bfloat16 halves everything.
    assert weight_bytes_per_device(params, model, 2, np.float32) == (64 * 32 // 2 + 32 + 2 * 32 * 32 // 2 + 64) * 4
    assert weight_bytes_per_device(params, model, 1, "bfloat16") == total // 2


def test_plan_counts_blocks_and_full_length_sequences():
    model = tiny_model()
    # K and V of 2 kv heads x head_dim 8, 2 layers, float32: 2 * 2 * 8 * 2 * 4 = 256 bytes a token.
    plan = plan_memory(model, weight_bytes=1000, num_kv_blocks=17, block_size=4, max_model_len=16,
                       dtype=np.float32, tp=1, layout="interleaved")
    assert plan.kv_bytes_per_token == 256 and plan.kv_bytes_per_block_per_device == 4 * 256
    assert plan.blocks_per_max_len_sequence == 4
    assert plan.max_sequences_at_max_model_len == 4  # 16 usable blocks (block 0 is the null block)
    assert plan.max_sequences_at_max_model_len == plan_memory(
        model, 1000, 17, 4, 17, np.float32, 1, "interleaved").max_sequences_at_max_model_len + 1  # 17 needs 5
    assert "4 sequences of max_model_len=16" in plan.describe()
    plan.check()
    # Split over tp=2 devices, each holds half of every block.
    assert plan_memory(model, 1000, 17, 4, 16, np.float32, 2, "interleaved").kv_bytes_per_block_per_device == 512


@pytest.mark.parametrize("num_kv_blocks, max_model_len, fits", [(5, 16, True), (4, 16, False), (5, 17, False),
                                                                (2, 1, True), (2, 5, False)])
def test_pool_must_hold_one_max_model_len_sequence(num_kv_blocks, max_model_len, fits):
    plan = MemoryPlan(0, 256, 1024, num_kv_blocks, block_size=4, max_model_len=max_model_len)
    if fits:
        plan.check()
        return
    with pytest.raises(ValueError, match=r"max_model_len: .* lower max_model_len to <= \d+, or raise "
                                         r"num_kv_blocks to >= \d+ \(kv_cache_memory to >= \d+ bytes"):
        plan.check()


def test_weights_over_the_device_say_which_tensor_parallel_size_fits():
    check_weights_fit(8 << 30, None, 1, np.float32)  # CPU: no device limit
    check_weights_fit(8 << 30, 16 << 30, 1, np.float32)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: .* 16.00 GiB per device .* use "
                                         r"tensor_parallel_size >= 2"):
        check_weights_fit(16 << 30, 16 << 30, 1, "bfloat16")
    with pytest.raises(ValueError, match="tensor_parallel_size >= 8"):
        check_weights_fit(60 << 30, 16 << 30, 1, "bfloat16")


def test_engine_refuses_a_pool_smaller_than_one_sequence(tiny_model_dir):
    from jaxpaged.config import EngineConfig
    from jaxpaged.engine import LLMEngine
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(max_model_len=256, num_kv_blocks=8, block_size=16, dtype="float32",
                                       attention_backend="xla", compilation_cache_dir="")
    with pytest.raises(ValueError, match=r"max_model_len: 256 tokens need 16 KV blocks but the pool has 7 usable"):
        LLMEngine(load_model(str(tiny_model_dir)), config, warmup=False)

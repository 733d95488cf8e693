"""kv_cache_dtype "int8" on pallas_tpu (the packed quantized layout, TPU interpreter on this CPU) through the whole
engine equals the xla backend's int8 engine token for token: both quantize the same K/V with the same scheme, so only
the layouts and kernels differ."""

import jax.numpy as jnp
import pytest

from jaxpaged.models.registry import read_model_config
from jaxpaged.runner.kv_cache import bytes_per_block, choose_kv_layout, kv_storage_dtype
from jaxpaged.runner.mesh import kv_cache_spec
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA, save_tiny_llama
from tests.prefix_prompts import token_ids

# head_dim 64: the packed layouts' [K | V] vectors (head_dim 16 has no TPU layout).
TPU_LLAMA = dict(TINY_LLAMA, head_dim=64)
# One 16-token bucket: each engine compiles one forward step (a 32-token budget added a second bucket, and the
# pallas_tpu one holds the interpreted kernels of both layers); the 17- and 40-token prompts are still chunked beside
# the others' decodes.
OPTIONS = dict(TINY_ENGINE_OPTIONS, kv_cache_dtype="int8", max_num_seqs=4, max_num_batched_tokens=16,
               max_model_len=128, num_kv_blocks=24, block_size=16)


@pytest.fixture(scope="module")
def tpu_model_dir(tmp_path_factory, smollm2_tokenizer_dir):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-d64"), smollm2_tokenizer_dir, TPU_LLAMA)


def test_pallas_tpu_plans_the_packed_quantized_layout():
    model = read_model_config(dict(TPU_LLAMA, model_type="llama"))
    assert choose_kv_layout(model, "pallas_tpu", jnp.bfloat16, 1, "int8") == "packed_quantized"
    assert choose_kv_layout(model, "pallas_tpu", jnp.bfloat16, 2, "fp8_e4m3") == "packed_quantized"
    assert choose_kv_layout(model, "xla", jnp.bfloat16, 1, "int8") == "quantized"
    assert kv_cache_spec("packed_quantized") == kv_cache_spec("packed")
    # 2 heads of 64 at page 16: 4 quads x 2 vectors + 1 scale row = 9 rows -> 16; bfloat16 packed: 16 x 1 row.
    int8 = bytes_per_block(model, 16, kv_storage_dtype(jnp.bfloat16, "int8"), "tpu", layout="packed_quantized")
    bf16 = bytes_per_block(model, 16, jnp.bfloat16, "tpu", layout="packed")
    assert int8 == 2 * 16 * 128 * 4 == bf16
    at_64 = bytes_per_block(model, 64, kv_storage_dtype(jnp.bfloat16, "int8"), "tpu", layout="packed_quantized")
    assert at_64 == 2 * 40 * 128 * 4 < bytes_per_block(model, 64, jnp.bfloat16, "tpu", layout="packed")
    with pytest.raises(ValueError, match="^kv_cache_dtype:"):
        choose_kv_layout(read_model_config(dict(TINY_LLAMA, model_type="llama")), "pallas_tpu", jnp.bfloat16, 1,
                         "int8")


def test_int8_tokens_on_pallas_tpu_equal_the_xla_backend(tpu_model_dir):
    """Prompts of 1, 15, 17 and 40 tokens (chunked prefill beside decodes), 8 greedy tokens each."""
    from jaxpaged.llm import LLM

    prompts = [{"prompt_token_ids": token_ids(seed, length)} for seed, length in ((1, 1), (2, 15), (3, 17), (4, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tokens = {}
    for backend in ("pallas_tpu", "xla"):
        llm = LLM(str(tpu_model_dir), **dict(OPTIONS, attention_backend=backend))
        runner = llm.engine.runner
        assert runner.kv_layout == ("packed_quantized" if backend == "pallas_tpu" else "quantized")
        tokens[backend] = [output.outputs[0].token_ids
                           for output in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens["pallas_tpu"] == tokens["xla"]


def test_a_block_size_that_is_no_multiple_of_4_is_refused_naming_it(tpu_model_dir):
    from jaxpaged.llm import LLM

    with pytest.raises(ValueError, match="^block_size: .* multiple of 4 tokens; got 6"):
        LLM(str(tpu_model_dir), **dict(OPTIONS, attention_backend="pallas_tpu", block_size=6))


@pytest.mark.parametrize("block_size, warns", [(16, True), (64, False)])
def test_a_block_size_whose_padding_saves_nothing_is_warned_about(block_size, warns, caplog):
    """2 KV heads of 64 at block 16: 9 rows pad to 16, a bfloat16 packed block's size; at 64, 40 rows against 64."""
    import logging

    from jaxpaged.config import EngineConfig
    from jaxpaged.runner.startup import _check_tpu_quantized_block

    model = read_model_config(dict(TPU_LLAMA, model_type="llama"))
    config = EngineConfig.from_options(block_size=block_size, kv_cache_dtype="int8", attention_backend="pallas_tpu")
    with caplog.at_level(logging.WARNING, logger="jaxpaged"):
        _check_tpu_quantized_block(model, config, jnp.bfloat16, "tpu", 1)
    assert any("saves no KV memory" in record.getMessage() for record in caplog.records) == warns

"""A bfloat16 engine step on the CPU never rewrites a whole stacked weight or the KV pool in float32.

XLA:CPU has neither a bfloat16 scatter nor a bfloat16 dynamic-slice: it converts the operand to float32 and back. On
the KV pool that made every layer's write a full copy; on the stacked layer weights, hoisted out of the layer loop,
every step rewrote all weights. The runner keeps both as uint16 bits (kv_layout "interleaved_bits", DecoderLayers),
so neither full-size float32 array may appear in the compiled step.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.config import EngineConfig
from jaxpaged.runner.kv_cache import choose_kv_layout
from jaxpaged.runner.mesh import kv_cache_spec
from tests.conftest import TINY_LLAMA, save_tiny_llama
from tests.runner.test_step_preparation import _model


def test_bfloat16_on_the_xla_backend_keeps_kv_as_bits():
    model = _model(head_dim=64)  # a head_dim the packed TPU layout holds
    assert choose_kv_layout(model, "xla", jnp.bfloat16) == "interleaved_bits"
    assert choose_kv_layout(model, "xla", jnp.bfloat16, tensor_parallel_size=2) == "interleaved_bits"
    assert choose_kv_layout(model, "xla", jnp.float32) == "interleaved"
    assert choose_kv_layout(model, "pallas_gpu", jnp.bfloat16) == "interleaved"
    assert choose_kv_layout(model, "pallas_tpu", jnp.bfloat16) == "packed"
    # Split on the kv-head axis under tensor parallelism, like the float pool.
    assert kv_cache_spec("interleaved_bits") == kv_cache_spec("interleaved")


@pytest.fixture(scope="module")
def bfloat16_runner(tmp_path_factory, smollm2_tokenizer_dir):
    from jaxpaged.runner.model_runner import ModelRunner
    from jaxpaged.weights.loader import load_model

    # 3 layers and odd widths, so no attention intermediate of the step shares a stacked weight's shape.
    odd_sizes = {**TINY_LLAMA, "num_hidden_layers": 3, "hidden_size": 48, "intermediate_size": 112}
    model_dir = save_tiny_llama(tmp_path_factory.mktemp("odd-llama"), smollm2_tokenizer_dir, odd_sizes)
    config = EngineConfig.from_options(block_size=16, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=16,
                                       max_num_seqs=8, dtype="bfloat16", attention_backend="xla")
    return ModelRunner(load_model(str(model_dir)), config)


def _float32_shape(shape: tuple[int, ...]) -> str:
    return "f32[" + ",".join(map(str, shape)) + "]"


def test_the_compiled_step_holds_no_float32_copy_of_weights_or_pool(bfloat16_runner):
    runner = bfloat16_runner
    assert runner.kv_layout == "interleaved_bits" and runner.kv_cache.dtype == np.uint16
    # The stacked matrices ([layers, in, out]); the norms' [layers, hidden] could match an unrelated small array.
    stacked = [weight for path, weight in jax.tree_util.tree_leaves_with_path(runner.state)
               if "layers" in jax.tree_util.keystr(path) and weight.ndim == 3]
    assert stacked and all(weight.dtype == np.uint16 for weight in stacked)
    (bucket,) = runner.ladder.buckets()
    hlo = runner._executable(bucket).as_text()
    full_size = {_float32_shape(runner.kv_cache.shape)} | {_float32_shape(weight.shape) for weight in stacked}
    shapes_in_hlo = set(re.findall(r"f32\[[0-9,]*\]", hlo))
    assert not full_size & shapes_in_hlo

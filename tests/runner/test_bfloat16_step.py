"""A bfloat16 engine step on the CPU never rewrites a layer weight or the KV pool in float32, nor copies a weight.

XLA:CPU has neither a bfloat16 scatter nor a bfloat16 dynamic-slice: it converts the operand to float32 and back. On
the KV pool that made every layer's write a full copy, so the runner keeps the pool as uint16 bits (kv_layout
"interleaved_bits"). On the CPU the layer weights are stored per layer and the layers unrolled (llama.DecoderLayers),
so every matmul reads its bfloat16 weight where it lies: no float32 copy, and no slice or copy in any dtype.
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
    # One TPU layout for every tensor-parallel degree: each shard packs its own heads (kv_layout.py).
    assert choose_kv_layout(model, "pallas_tpu", jnp.bfloat16, tensor_parallel_size=2) == "packed"
    assert choose_kv_layout(model, "pallas_tpu", jnp.float32, tensor_parallel_size=2) == "packed"
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


def _shapes(hlo: str, dtype: str, shapes) -> set[str]:
    wanted = {f"{dtype}[" + ",".join(map(str, shape)) + "]" for shape in shapes}
    return wanted & set(re.findall(dtype + r"\[[0-9,]*\]", hlo))


def test_the_cpu_step_reads_each_layer_weight_in_place(bfloat16_runner):
    runner = bfloat16_runner
    assert runner.kv_layout == "interleaved_bits" and runner.kv_cache.dtype == np.uint16
    # On the CPU the weights are stored per layer ([in, out] matrices, or their panels where the CPU has the packed
    # bfloat16 matmul), in bfloat16 itself.
    matrices = [weight for path, weight in jax.tree_util.tree_leaves_with_path(runner.state)
                if "layers" in jax.tree_util.keystr(path) and weight.ndim in (2, 3)]
    assert len(matrices) == 3 * 7 and all(weight.dtype == jnp.bfloat16 for weight in matrices)
    (bucket,) = runner.ladder.buckets()
    hlo = runner.step.executable(bucket).as_text()
    # No float32 copy of the pool or of any weight...
    assert not _shapes(hlo, "f32", [runner.kv_cache.shape] + [weight.shape for weight in matrices])
    # ...and no instruction but a parameter holds a weight-shaped bfloat16 array: no slice or copy of a weight.
    weight_shapes = _shapes(hlo, "bf16", [weight.shape for weight in matrices])
    assert weight_shapes
    made = [line for line in hlo.splitlines() if "parameter(" not in line and "bitcast(" not in line
            and any(f"= {shape}" in line for shape in weight_shapes)]
    assert not made, made[:3]

"""The engine with quantization="int8" against an independent reference: the same checkpoint fake-quantized in
float32 (each projection quantized and dequantized on the host, written as a float checkpoint, loaded without
quantization) must generate the same greedy tokens; the start-up plan reports the int8 weight bytes; a bad scheme
is refused before any weight is read."""

import json
import logging
import pathlib
import shutil

import numpy as np
import pytest

from jaxpaged.models.int8_weights import dequantize_int8, quantize_int8
from jaxpaged.runner.int8_probe import int8_candidates
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA

_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PROMPTS = ["The capital of France is", "Paged attention keeps", "1, 2, 3,", "Once upon a time there was a"]


def _fake_quantized_checkpoint(source: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """`source`'s HF checkpoint with every projection replaced by its int8 round trip, in float32."""
    from safetensors.numpy import load_file, save_file

    target.mkdir()
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, target / file.name)
    for file in source.glob("*.safetensors"):
        tensors = load_file(str(file))
        for name, tensor in tensors.items():
            if name.endswith(".weight") and name.split(".")[-2] in _PROJECTIONS:
                # HF stores [outer, inner]; an output channel is a row, a column of the transposed view.
                values, scale = quantize_int8(tensor.astype(np.float32).T)
                tensors[name] = np.ascontiguousarray(dequantize_int8(values, scale).T)
        save_file(tensors, str(target / file.name), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """The fake-quantized float32 checkpoint's LLM."""
    from jaxpaged.llm import LLM

    return LLM(str(_fake_quantized_checkpoint(tiny_model_dir, tmp_path_factory.mktemp("fake-int8") / "model")),
               **TINY_ENGINE_OPTIONS)


@pytest.fixture(scope="module", params=["native", "xla"])
def quantized(request, tiny_model_dir):
    """The int8 engine's LLM: int8 panels in the native CPU matmul, or XLA's dot with the scales on its output."""
    from jaxpaged.llm import LLM

    return LLM(str(tiny_model_dir), quantization="int8", cpu_matmul=request.param, **TINY_ENGINE_OPTIONS)


def test_int8_engine_generates_the_fake_quantized_models_greedy_tokens(quantized, reference):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    got = [output.outputs[0].token_ids for output in quantized.generate(_PROMPTS, params)]
    expected = [output.outputs[0].token_ids for output in reference.generate(_PROMPTS, params)]
    assert got == expected


def test_the_plan_counts_int8_projection_bytes_and_names_the_format(quantized, reference):
    hidden, inner, layers = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"], TINY_LLAMA["num_hidden_layers"]
    q_dim = TINY_LLAMA["num_attention_heads"] * TINY_LLAMA["head_dim"]
    kv_dim = TINY_LLAMA["num_key_value_heads"] * TINY_LLAMA["head_dim"]
    weights = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * inner
    outputs = q_dim + 2 * kv_dim + hidden + 2 * inner + hidden
    # float32 weights of 4 bytes become 1 byte each plus a float32 scale per output column.
    saved = layers * (3 * weights - 4 * outputs)
    plan, reference_plan = quantized.engine.runner.plan, reference.engine.runner.plan
    assert reference_plan.memory.weight_bytes_per_device - plan.memory.weight_bytes_per_device == saved
    assert plan.quantization == "int8" and reference_plan.quantization is None
    native = quantized.engine.config.cpu_matmul == "native"
    # On the native path the start-up probe picks whichever int8 matmul it timed fastest (int8_probe.py).
    assert plan.int8_matmul in (int8_candidates(plan.per_layer, 1) if native else ("xla",))
    expected_matmul = plan.int8_matmul
    kernel = {"int16 digits": "XLA int8 x int8 dot of 16-bit inputs as two int8 digits, int32 sums",
              "panels": "native, packed int8 panels", "xla": "XLA dot, scales on the output",
              "vnni digits": "native VNNI int8 x int8 (VPDPBUSD) of 16-bit inputs as two int8 digits, packed weights",
              "bf16 panels": "native bfloat16 pair dot (VDPBF16PS) of inputs rounded to bfloat16, int8 panels widened "
                             "in the kernel, float32 sums"}[expected_matmul]
    assert f"int8 projections: {kernel}" in plan.describe()
    assert "MiB (int8 projections + float32)" in plan.describe()
    assert "MiB (float32)" in reference_plan.describe()


def test_an_unknown_scheme_is_refused_naming_the_field_before_loading(tmp_path, caplog):
    from jaxpaged.llm import LLM

    with caplog.at_level(logging.INFO, logger="jaxpaged"):
        with pytest.raises(ValueError, match="^quantization: .awq. is not supported by jaxpaged; supported: int8"):
            LLM(str(tmp_path / "no-model-here"), quantization="awq", **TINY_ENGINE_OPTIONS)
    assert not caplog.records  # nothing loaded, nothing planned


def test_vllm_tpu_int8_name_is_int8():
    from jaxpaged.config import EngineConfig

    assert EngineConfig.from_options(quantization="tpu_int8").quantization == "int8"
    assert EngineConfig.from_options().quantization is None


def test_the_fake_quantized_reference_differs_from_the_original(tiny_model_dir, tmp_path):
    """The reference is no copy of the float model: the round trip changes the projections."""
    from safetensors.numpy import load_file

    target = _fake_quantized_checkpoint(tiny_model_dir, tmp_path / "model")
    assert json.loads((target / "config.json").read_text())["hidden_size"] == TINY_LLAMA["hidden_size"]
    original = load_file(str(tiny_model_dir / "model.safetensors"))
    rounded = load_file(str(target / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    assert not np.array_equal(original[name], rounded[name])
    np.testing.assert_array_equal(original["model.embed_tokens.weight"], rounded["model.embed_tokens.weight"])

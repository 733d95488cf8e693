"""A GGUF whose projections are Q8_0 loads them as int8 (requantized per output channel), not float32: within both
roundings of the gguf package's own dequantization, and the engine on it generates the greedy tokens of the float32
model of the same requantized weights; other GGUFs still load as float32."""

import json
import pathlib
import shutil

import gguf
import numpy as np
import pytest

from jaxpaged.models.int8_weights import dequantize_int8
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.default_model import default_model_path
from jaxpaged.weights.gguf_checkpoint import _unpermute_rope_rows, load_gguf_checkpoint
from jaxpaged.weights.loader import load_model, locate_model
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA
from tests.weights.gguf_files import write_llama_gguf
from tests.weights.load_peak import measure_load_peak

_PROJECTIONS = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
_HF_NAMES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
             "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_PROMPTS = ["The capital of France is", "Paged attention keeps", "1, 2, 3,", "Once upon a time there was a"]


@pytest.fixture(scope="module")
def q8_0_gguf(tiny_model_dir, tmp_path_factory) -> pathlib.Path:
    """The tiny model as a Q8_0 GGUF with the embedded model's tokenizer (the engine needs one)."""
    return write_llama_gguf(tmp_path_factory.mktemp("q8_0") / "tiny.Q8_0.gguf", tiny_model_dir, default_model_path(),
                            gguf.GGMLQuantizationType.Q8_0)


@pytest.fixture(scope="module")
def q8_0_weights_gguf(tiny_model_dir, tmp_path_factory) -> pathlib.Path:
    """The same tensors with no tokenizer metadata: what is read is the weights, and each read of a GGUF that holds
    the 49,152-token vocabulary and its merges costs the gguf reader about 2.5 s of CPU."""
    return write_llama_gguf(tmp_path_factory.mktemp("q8_0") / "tiny.Q8_0.gguf", tiny_model_dir, None,
                            gguf.GGMLQuantizationType.Q8_0)


def _gguf_dequantized(tensors: dict[str, "gguf.ReaderTensor"], name: str, layer: int) -> np.ndarray:
    """The gguf package's own float32 of one projection, in jaxpaged's orientation ([in, out], HF's row order)."""
    tensor = tensors[f"blk.{layer}.{_PROJECTIONS[name]}.weight"]
    rows = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
    heads = {"q_proj": TINY_LLAMA["num_attention_heads"], "k_proj": TINY_LLAMA["num_key_value_heads"]}
    return (_unpermute_rope_rows(rows, heads[name]) if name in heads else rows).T


def test_q8_0_projections_load_as_int8_within_both_roundings(q8_0_weights_gguf):
    """Each column's scale is its row's largest block scale, and every weight is within half a block step plus half
    a column step of the gguf package's dequantization (the requantization's second rounding)."""
    _, params, scheme = load_gguf_checkpoint(q8_0_weights_gguf)
    assert scheme == "int8" and params["embed"].dtype == np.float32
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(str(q8_0_weights_gguf)).tensors}
    for layer in range(TINY_LLAMA["num_hidden_layers"]):
        for name in _PROJECTIONS:
            values, scale = params[f"layers.{name}"][layer], params[f"layers.{name}_scale"][layer]
            assert values.dtype == np.int8 and scale.dtype == np.float32
            expected = _gguf_dequantized(tensors, name, layer)
            inner = expected.shape[0]
            block_step = np.abs(expected.reshape(inner // 32, 32, -1)).max(axis=1) / 127  # [blocks, out]
            np.testing.assert_allclose(scale, block_step.max(axis=0), rtol=1e-6, err_msg=f"{name}[{layer}]")
            error = np.abs(dequantize_int8(values, scale) - expected)
            bound = (np.repeat(block_step, 32, axis=0) + scale) / 2
            assert np.all(error <= bound * (1 + 1e-5) + 1e-9), f"{name}[{layer}]"


def test_other_ggufs_still_load_as_float32(tiny_model_dir, tmp_path):
    # No tokenizer metadata: the scheme is read from the tensor types (and the vocabulary costs 5 s to write and read).
    path = write_llama_gguf(tmp_path / "tiny.F32.gguf", tiny_model_dir, None, gguf.GGMLQuantizationType.F32)
    _, params, scheme = load_gguf_checkpoint(path)
    assert scheme is None and params["layers.q_proj"].dtype == np.float32 and "layers.q_proj_scale" not in params


def _requantized_hf_checkpoint(source: pathlib.Path, params: dict[str, np.ndarray], target: pathlib.Path):
    """`source`'s HF checkpoint with every projection replaced by the int8 `params`' dequantized weights."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, target)
    tensors = load_file(str(source / "model.safetensors"))
    for layer in range(TINY_LLAMA["num_hidden_layers"]):
        for name, block in _HF_NAMES.items():
            weight = dequantize_int8(params[f"layers.{name}"][layer], params[f"layers.{name}_scale"][layer])
            tensors[f"model.layers.{layer}.{block}.{name}.weight"] = np.ascontiguousarray(weight.T)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_engine_on_a_q8_0_gguf_generates_the_requantized_float_models_tokens(q8_0_gguf, tiny_model_dir, tmp_path):
    from jaxpaged.llm import LLM

    converted, _ = locate_model(str(q8_0_gguf), cache_dir=tmp_path / "cache")
    assert json.loads((converted / "jaxpaged.json").read_text())["quantization"] == "int8"
    loaded = load_model(str(converted))
    assert loaded.quantization == "int8" and loaded.params["layers.q_proj"].dtype == np.int8
    reference_dir = _requantized_hf_checkpoint(tiny_model_dir, loaded.params, tmp_path / "requantized")
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(str(reference_dir), **TINY_ENGINE_OPTIONS) as reference:
        expected = [output.outputs[0].token_ids for output in reference.generate(_PROMPTS, params)]
    with LLM(str(converted), **TINY_ENGINE_OPTIONS) as llm:
        assert llm.engine.runner.plan.quantization == "int8"
        got = [output.outputs[0].token_ids for output in llm.generate(_PROMPTS, params)]
    assert got == expected
    with pytest.raises(ValueError, match="^quantization: 'compressed-tensors' applies to compressed-tensors"):
        load_model(str(converted), quantization="compressed-tensors")


def test_a_q8_0_load_holds_the_int8_model_and_the_mapped_file_not_a_float32_copy(tmp_path):
    """Peak host memory while loading a 50 MiB Q8_0 GGUF: its int8 parameters, the file's pages the reader maps
    (file-backed) and one float32 layer being requantized; a float32 copy of the projections would be ~4x the
    file on top."""
    import torch
    import transformers

    from tests.weights.test_lazy_bf16_load import MEMORY_LLAMA

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**MEMORY_LLAMA)).save_pretrained(tmp_path / "hf")
    path = write_llama_gguf(tmp_path / "model.Q8_0.gguf", tmp_path / "hf", None, gguf.GGMLQuantizationType.Q8_0)
    file_size = path.stat().st_size
    report = measure_load_peak("import gguf\nfrom jaxpaged.weights.gguf_checkpoint import load_gguf_checkpoint",
                               "_, params, scheme = load_gguf_checkpoint(pathlib.Path(sys.argv[1]))",
                               '{"scheme": scheme, "params_bytes": sum(value.nbytes for value in params.values())}',
                               path)
    assert report["scheme"] == "int8" and report["params_bytes"] < file_size
    growth = report["growth_bytes"] / file_size
    assert growth <= 2.4, f"loading grew host memory by {growth:.2f}x the {file_size / 2**20:.0f} MiB file"

"""Quantizing to int8 while a float32 checkpoint loads streams layer by layer: the host's peak grows by about the
int8 model, never by the float one (which is 4x that)."""


import numpy as np
import torch
import transformers

from tests.weights.load_peak import measure_load_peak
from tests.weights.test_lazy_bf16_load import MEMORY_LLAMA

MAX_GROWTH = 0.4
"""Peak host memory growth while loading, as a share of the float32 checkpoint: the int8 projections are ~0.25 of
it, plus one float layer being quantized; a float copy of the layers would be >= 1."""

def test_int8_load_peak_is_near_the_int8_size(tmp_path):
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**MEMORY_LLAMA)).save_pretrained(tmp_path)
    file_size = sum(f.stat().st_size for f in tmp_path.glob("*.safetensors"))
    report = measure_load_peak("from jaxpaged.weights.loader import load_model",
                               'loaded = load_model(sys.argv[1], quantization="int8")',
                               '{"q_proj": str(loaded.params["layers.q_proj"].dtype), '
                               '"scale": str(loaded.params["layers.q_proj_scale"].dtype)}', tmp_path)
    assert (report["q_proj"], report["scale"]) == (str(np.dtype(np.int8)), "float32")
    growth = report["growth_bytes"] / file_size
    assert growth <= MAX_GROWTH, f"loading grew host memory by {growth:.2f}x the {file_size / 2**20:.0f} MiB checkpoint"

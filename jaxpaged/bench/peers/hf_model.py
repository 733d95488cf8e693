"""Loading the HF transformers peer model: the same weights as jaxpaged (dequantized to float32, or cast to bfloat16
for the bfloat16 rows), no network."""

import pathlib
from typing import Optional

from jaxpaged.bench.peers import PeerUnavailable


def hf_source(model: Optional[str]) -> dict:
    """from_pretrained arguments for `model` (None: the embedded GGUF); PeerUnavailable for other formats."""
    if model is None:
        from jaxpaged.weights.default_model import default_model_path

        path = default_model_path()
        return {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    path = pathlib.Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return {"pretrained_model_name_or_path": str(path)}
    raise PeerUnavailable(f"model: the HF peers load an HF checkpoint directory or a .gguf file, got {model!r}")


def gguf_path(model: Optional[str]) -> pathlib.Path:
    """The GGUF file of `model` (llama.cpp's only format); PeerUnavailable otherwise."""
    source = hf_source(model)
    if "gguf_file" not in source:
        raise PeerUnavailable(f"model: llama.cpp needs a .gguf file, got {model!r}")
    return pathlib.Path(source["pretrained_model_name_or_path"]) / source["gguf_file"]


class HFPeerModel:
    """The torch model, loaded once per run and shared by the HF peers."""

    def __init__(self, model: Optional[str], dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM

        self.dtype = dtype
        """"float32" or "bfloat16": the weights' and activations' dtype."""
        self.model = AutoModelForCausalLM.from_pretrained(**hf_source(model), dtype=getattr(torch, dtype)).eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.model.config.eos_token_id
        self.eos_token_id: Optional[int] = eos[0] if isinstance(eos, (list, tuple)) else eos
        """The model's EOS id; also the pad id of left-padded batches, as HF's examples do."""
        self.pad_token_id = self.eos_token_id if self.eos_token_id is not None else 0

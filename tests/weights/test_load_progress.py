"""A checkpoint's read (and its int8 quantization, the slow part of an int8 load) shows a bar in a terminal."""

import numpy as np
import pytest

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.param_shapes import param_shapes
from jaxpaged.models.registry import read_model_config
from jaxpaged.weights.param_names import stack_layers
from tests.conftest import TINY_LLAMA


def _zeros_fetch(cfg: ModelConfig):
    shapes = param_shapes(cfg)

    def fetch(name, layer):
        shape = shapes[name] if layer is None else shapes["layers." + name][1:]
        return np.zeros(shape, np.float32)

    return fetch


@pytest.mark.parametrize("quantization, label", [(None, "Reading weights"),
                                                 ("int8", "Reading weights, quantizing to int8")])
def test_reading_and_quantizing_weights_show_progress_when_asked(quantization, label, capsys):
    """progress=True (a terminal) shows the bar, one step per tensor read; progress=False shows nothing."""
    cfg = read_model_config({**TINY_LLAMA, "architectures": ["LlamaForCausalLM"]})
    num_fetches = sum(cfg.num_layers if name.startswith("layers.") else 1 for name in param_shapes(cfg))
    stack_layers(cfg, _zeros_fetch(cfg), quantization, progress=True)
    err = capsys.readouterr().err
    assert label in err and f"/{num_fetches} " in err  # every layer of every tensor is counted
    stack_layers(cfg, _zeros_fetch(cfg), quantization, progress=False)
    assert capsys.readouterr().err == ""

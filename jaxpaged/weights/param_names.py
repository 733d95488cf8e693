"""Turning per-layer checkpoint tensors into jaxpaged's stacked parameter dict."""

from collections.abc import Callable
from typing import Optional

import numpy as np

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.param_shapes import param_shapes


def stack_layers(cfg: ModelConfig, fetch: Callable[[str, Optional[int]], np.ndarray]) -> dict[str, np.ndarray]:
    """Build every parameter by calling fetch(name, layer) per layer (layer None for global weights).

    fetch returns arrays already in jaxpaged's orientation ([in, out] for projections).
    """
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.startswith("layers."):
            short = name[len("layers."):]
            params[name] = np.stack([fetch(short, layer) for layer in range(cfg.num_layers)])
        else:
            params[name] = fetch(name, None)
        if params[name].shape != shape:
            raise ValueError(f"checkpoint tensor {name}: expected shape {shape}, got {params[name].shape}")
    return params

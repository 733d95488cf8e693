"""The engine dtype is always a numpy dtype whose str is the plain name: the KV tiers' fingerprint and the bench's
roofline key on it ("auto" must give the same name as the dtype it stands for)."""

import jax.numpy as jnp
import numpy as np

from jaxpaged.runner.model_runner import resolve_dtype


def test_auto_is_float32_on_cpu_and_a_plain_dtype():
    for name in ("auto", "float32"):
        dtype = resolve_dtype(name)
        assert isinstance(dtype, np.dtype) and str(dtype) == "float32"
    assert str(resolve_dtype("bfloat16")) == "bfloat16" and resolve_dtype("bfloat16") == jnp.bfloat16

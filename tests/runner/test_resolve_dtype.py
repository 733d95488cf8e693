"""The engine dtype: always a numpy dtype whose str is the plain name (the KV tiers' fingerprint and the bench's
roofline key on it), and "auto" on the CPU is what the start-up probe found faster."""

import logging

import jax.numpy as jnp
import numpy as np

from jaxpaged.runner import dtype_probe
from jaxpaged.runner.dtype_probe import DtypeProbe, probe_cpu_dtype
from jaxpaged.runner.model_runner import resolve_dtype


def test_named_dtypes_are_plain_numpy_dtypes():
    for name in ("float32", "bfloat16", "float16"):
        dtype = resolve_dtype(name)
        assert isinstance(dtype, np.dtype) and str(dtype) == name
    assert resolve_dtype("bfloat16") == jnp.bfloat16


def test_the_probe_picks_bfloat16_only_when_clearly_faster():
    assert DtypeProbe(float32_seconds=1.0, bfloat16_seconds=0.5).choice == jnp.bfloat16
    assert DtypeProbe(float32_seconds=1.0, bfloat16_seconds=0.95).choice == jnp.float32  # a near tie: exact wins
    assert DtypeProbe(float32_seconds=1.0, bfloat16_seconds=2.0).choice == jnp.float32
    assert str(DtypeProbe(1.0, 0.5).choice) == "bfloat16"


def test_auto_on_the_cpu_is_the_probes_choice_and_is_logged(caplog, monkeypatch):
    probe_cpu_dtype.cache_clear()
    monkeypatch.setattr(dtype_probe, "PROBE_ROWS", (8,))  # the same loop, smaller
    monkeypatch.setattr(dtype_probe, "PROBE_LAYERS", 2)
    with caplog.at_level(logging.INFO, logger=dtype_probe.__name__):
        dtype = resolve_dtype("auto")
    probe = probe_cpu_dtype()
    probe_cpu_dtype.cache_clear()  # the shrunken probe must not answer for later engines in this process
    assert probe.float32_seconds > 0 and probe.bfloat16_seconds > 0
    assert isinstance(dtype, np.dtype) and dtype == probe.choice
    assert f"dtype auto on this CPU: {dtype.name}" in caplog.text

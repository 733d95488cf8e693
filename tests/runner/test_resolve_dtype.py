"""The engine dtype: always a numpy dtype whose str is the plain name (the KV tiers' fingerprint and the bench's
roofline key on it), and "auto" on the CPU is what the start-up probe found faster, measured once per machine."""

import json
import logging

import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.packed_matmul import packed_matmul_available
from jaxpaged.runner import dtype_probe
from jaxpaged.runner.dtype_probe import DtypeProbe, probe_cpu_dtype
from jaxpaged.runner.startup import resolve_dtype


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


def test_auto_on_the_cpu_is_the_probes_choice_and_is_logged(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing kept yet: the probe measures
    probe_cpu_dtype.cache_clear()
    monkeypatch.setattr(dtype_probe, "PROBE_ROWS", (8,))  # the same loop, smaller
    monkeypatch.setattr(dtype_probe, "PROBE_LAYERS", 2)
    with caplog.at_level(logging.INFO, logger=dtype_probe.__name__):
        dtype = resolve_dtype("auto")
    probe = probe_cpu_dtype()
    probe_cpu_dtype.cache_clear()  # the shrunken probe must not answer for later engines in this process
    assert probe.float32_seconds > 0 and probe.bfloat16_seconds > 0
    assert isinstance(dtype, np.dtype) and dtype == probe.choice
    assert f"dtype auto on this CPU: {dtype.name}" in caplog.text and "measured now" in caplog.text


@pytest.fixture
def fake_timings(monkeypatch, tmp_path):
    """A fresh cache directory and a probe whose loops 'take' 2 ms in float32 and 1 ms in bfloat16; the list
    records every loop timed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed = []

    def time_loop(dtype, rows, native_matmul):
        timed.append((jnp.dtype(dtype).name, rows, native_matmul))
        return 0.002 if dtype == jnp.float32 else 0.001

    monkeypatch.setattr(dtype_probe, "_time_loop", time_loop)
    probe_cpu_dtype.cache_clear()
    yield timed
    probe_cpu_dtype.cache_clear()


def test_the_verdict_is_kept_for_the_next_start_on_this_machine(fake_timings, caplog):
    first = probe_cpu_dtype()
    assert len(fake_timings) == 2 * len(dtype_probe.PROBE_ROWS)
    path = dtype_probe.verdict_path()
    assert json.loads(path.read_text()) == {"float32_seconds": first.float32_seconds,
                                            "bfloat16_seconds": first.bfloat16_seconds}
    probe_cpu_dtype.cache_clear()  # a new process
    with caplog.at_level(logging.INFO, logger=dtype_probe.__name__):
        again = probe_cpu_dtype()
    assert again == first and len(fake_timings) == 2 * len(dtype_probe.PROBE_ROWS)  # nothing timed again
    assert f"kept in {path}" in caplog.text


@pytest.mark.parametrize("damage", ["", "{not json", '{"float32_seconds": 1.0}',
                                    '{"float32_seconds": -1.0, "bfloat16_seconds": 1.0}'])
def test_a_damaged_verdict_is_measured_again(fake_timings, damage):
    path = dtype_probe.verdict_path()
    path.parent.mkdir(parents=True)
    path.write_text(damage)
    assert probe_cpu_dtype().choice == jnp.bfloat16
    assert len(fake_timings) == 2 * len(dtype_probe.PROBE_ROWS)
    assert json.loads(path.read_text())["bfloat16_seconds"] == 0.001 * len(dtype_probe.PROBE_ROWS)


def test_another_probe_shape_keeps_its_own_verdict(fake_timings, monkeypatch):
    kept = dtype_probe.verdict_path()
    monkeypatch.setattr(dtype_probe, "PROBE_LAYERS", dtype_probe.PROBE_LAYERS + 1)
    assert dtype_probe.verdict_path() != kept and dtype_probe.verdict_path().parent == kept.parent


def test_the_probe_times_the_matmuls_the_config_chose_and_keeps_a_verdict_for_each(fake_timings):
    """cpu_matmul="xla" is probed with XLA's dot (not the packed kernel) and kept apart from the native verdict
    wherever the packed kernel builds."""
    probe_cpu_dtype(native_matmul=False)
    assert {native for _, _, native in fake_timings} == {False}
    probe_cpu_dtype(native_matmul=True)
    assert {native for _, _, native in fake_timings} == {False, True}
    if packed_matmul_available():
        assert dtype_probe.verdict_path(native_matmul=False) != dtype_probe.verdict_path(native_matmul=True)
    assert resolve_dtype("auto", native_matmul=False) == probe_cpu_dtype(native_matmul=False).choice

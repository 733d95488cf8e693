"""The packed matmul's gated form (packed_gated_matmul: silu(x @ gate) * (x @ up) in one native call, SiLU applied in
the register tile) against a float64 reference: rows at the tiling's edges (0, 1, a 12-row tile and either side, an
evenly split 64-row decode block, a 72-row work item and past it), panel counts below, at and past a 4-panel item and
odd ones, rows past num_rows left zero, SiLU's extremes (large gates of either sign, where exp over- or underflows),
and the MLP built on it (layers.gated_mlp) against the two-call path it replaces. AVX-512 builds only (elsewhere the
form is not built and gated_mlp takes the two calls); bfloat16 where the CPU has AVX512-BF16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.packed_matmul import (
    pack_panels,
    packed_gated_available,
    packed_gated_matmul,
    packed_matmul_available,
    packed_matmuls,
)
from jaxpaged.models import layers

needs_gated = pytest.mark.skipif(not (packed_matmul_available() and packed_gated_available("float32")),
                                 reason="the gated form is built only for AVX-512")
needs_gated_bfloat16 = pytest.mark.skipif(not packed_gated_available("bfloat16"),
                                          reason="needs AVX512-BF16 (and no AMX)")


def reference(x: np.ndarray, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(x @ gate) * (x @ up) in float64."""
    g = x.astype(np.float64) @ gate.astype(np.float64)
    with np.errstate(over="ignore"):  # exp(-g) is inf for g far below zero, and silu 0 there, as it should be
        return g / (1.0 + np.exp(-g)) * (x.astype(np.float64) @ up.astype(np.float64))


@needs_gated
@pytest.mark.parametrize("rows", [0, 1, 11, 12, 13, 64, 72, 73, 150])
@pytest.mark.parametrize("inner,outer", [(1, 16), (24, 64), (64, 80), (100, 144)])
def test_the_gated_product_equals_float64(rows, inner, outer):
    """Every row and column is silu(x @ gate) * (x @ up), at every tile and item edge."""
    rng = np.random.default_rng(rows * 1000 + inner + outer)
    x, gate, up = (rng.standard_normal(shape).astype(np.float32)
                   for shape in ((rows, inner), (inner, outer), (inner, outer)))
    got = np.asarray(packed_gated_matmul(jnp.asarray(x), jnp.asarray(pack_panels(gate)), jnp.asarray(pack_panels(up))))
    assert got.shape == (rows, outer) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(x, gate, up), rtol=1e-5, atol=1e-5 * inner)


@needs_gated
@pytest.mark.parametrize("rows,num_rows", [(64, 0), (64, 1), (64, 61), (150, 140)])
def test_rows_from_num_rows_on_are_zeros(rows, num_rows):
    """A step's padding rows come out zero; the real rows are the gated product."""
    rng = np.random.default_rng(num_rows)
    x, gate, up = (rng.standard_normal(shape).astype(np.float32) for shape in ((rows, 64), (64, 48), (64, 48)))
    got = np.asarray(packed_gated_matmul(jnp.asarray(x), jnp.asarray(pack_panels(gate)), jnp.asarray(pack_panels(up)),
                                         num_rows=jnp.int32(num_rows)))
    np.testing.assert_array_equal(got[num_rows:], 0.0)
    np.testing.assert_allclose(got[:num_rows], reference(x, gate, up)[:num_rows], rtol=1e-5, atol=1e-4)


@needs_gated
def test_silu_holds_at_the_extremes():
    """Gates of +-1e4 and +-100 (exp over- and underflows there): silu is the gate itself or zero, never NaN."""
    gates = np.array([-1e4, -100.0, -88.5, -20.0, -1e-3, 0.0, 1e-3, 20.0, 88.5, 100.0, 1e4, 3.0, -3.0, 0.5, -0.5, 7.0],
                     np.float32)
    x = np.ones((1, 1), np.float32)
    got = np.asarray(packed_gated_matmul(jnp.asarray(x), jnp.asarray(pack_panels(gates[None, :])),
                                         jnp.asarray(pack_panels(np.ones((1, 16), np.float32)))))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[0], reference(x, gates[None, :], np.ones((1, 16), np.float32))[0],
                               rtol=2e-6, atol=1e-30)


@needs_gated_bfloat16
@pytest.mark.parametrize("rows", [1, 12, 13, 64, 73])
def test_the_bfloat16_gated_product_is_rounded_once(rows):
    """bfloat16: float32 sums, SiLU and product in float32, one rounding at the end (within a bfloat16 unit)."""
    rng = np.random.default_rng(rows)
    x, gate, up = (rng.standard_normal(shape).astype(jnp.bfloat16) for shape in ((rows, 64), (64, 80), (64, 80)))
    got = packed_gated_matmul(jnp.asarray(x), jnp.asarray(pack_panels(gate)), jnp.asarray(pack_panels(up)))
    assert got.dtype == jnp.bfloat16
    expected = reference(x.astype(np.float32), gate.astype(np.float32), up.astype(np.float32))
    np.testing.assert_allclose(np.asarray(got, np.float32), expected, rtol=2 ** -8, atol=1e-2)


@needs_gated
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gated_mlp_takes_one_call_and_matches_the_two_call_path(dtype):
    """layers.gated_mlp on packed weights runs the gated form (one custom call fewer) and gives the two-call MLP."""
    if dtype == "bfloat16" and not packed_gated_available("bfloat16"):
        pytest.skip("needs AVX512-BF16")
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((13, 64)).astype(dtype))
    gate, up = (jnp.asarray(pack_panels((rng.standard_normal((64, 96)) / 8).astype(dtype))) for _ in range(2))
    down = jnp.asarray(pack_panels((rng.standard_normal((96, 64)) / 8).astype(dtype)))
    hlo = jax.jit(layers.gated_mlp).lower(x, gate, up, down).as_text()
    assert hlo.count("jaxpaged_packed_gated_matmul") == 1
    got = np.asarray(layers.gated_mlp(x, gate, up, down), np.float32)
    g, u = packed_matmuls(x, (gate, up), out_dtype=jnp.float32)
    expected = np.asarray(packed_matmuls((jax.nn.silu(g) * u).astype(dtype), (down,), out_dtype=jnp.float32)[0])
    tolerance = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)

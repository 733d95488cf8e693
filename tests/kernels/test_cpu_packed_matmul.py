"""The native CPU matmul against packed weights (jaxpaged/kernels/cpu_native/packed_matmul): it is really built and
called, and equals a float64 product at the edges of its tiling: 0 and 1 rows, the 6-row (AVX2) and 12-row (AVX-512)
register tiles and one row either side, blocks split evenly into smaller tiles (with AVX-512, 34, 46 and 64 rows as
12 + 11 + 11, 12 + 12 + 11 + 11 and 4 x 11 + 2 x 10), a 72-row work item and one row past it, several items; panel
counts below, at and past a 4-panel item, odd ones (the AVX-512 tile takes two panels). The AVX2 tiling is also built
and checked on a machine with AVX-512, where the default build takes the wider one. The bfloat16 kernel (pairs of
inner indices) runs where the CPU has AVX512-BF16; its packing is checked everywhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.native_build import register
from jaxpaged.kernels.cpu_native.packed_matmul import (
    FLAGS,
    SOURCE,
    fills_whole_panels,
    pack_panels,
    packed_bfloat16_available,
    packed_matmul,
    packed_matmul_available,
    packed_matmuls,
    panel_columns,
    unpack_panels,
)


@pytest.fixture(autouse=True, scope="module")
def registered_kernel():
    """Built and registered in this worker before any test calls it (gcc is on every machine that runs the tests)."""
    assert packed_matmul_available()


def test_the_kernel_is_built_and_in_the_compiled_program():
    hlo = jax.jit(packed_matmul).lower(jnp.zeros((4, 8)), jnp.zeros((2, 8, 16))).as_text()
    assert "jaxpaged_packed_matmul" in hlo


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 11, 12, 13, 25, 34, 46, 64, 72, 73, 150])
@pytest.mark.parametrize("inner,outer", [(1, 16), (24, 64), (64, 80), (100, 144)])
def test_the_product_equals_float64(rows, inner, outer):
    rng = np.random.default_rng(rows * 1000 + inner + outer)
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    weight = rng.standard_normal((inner, outer)).astype(np.float32)
    got = np.asarray(packed_matmul(jnp.asarray(x), jnp.asarray(pack_panels(weight))))
    assert got.shape == (rows, outer) and got.dtype == np.float32
    expected = x.astype(np.float64) @ weight.astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))


def test_the_avx2_tiling_equals_float64_too():
    # -mno-avx512f builds the 6 x 16 tile whatever this CPU has; registered under a target of its own.
    target = "jaxpaged_packed_matmul_avx2_test"
    assert register(SOURCE, (*FLAGS, "-mno-avx512f"), "JaxpagedPackedMatmul", target, fallback="nothing")
    rng = np.random.default_rng(7)
    for rows, inner, outer in [(1, 24, 16), (7, 64, 80), (73, 100, 144)]:
        x = rng.standard_normal((rows, inner)).astype(np.float32)
        weight = rng.standard_normal((inner, outer)).astype(np.float32)
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, outer), jnp.float32))
        for num_rows in sorted({rows, rows - 1, 6, 7}):  # every row; the tail of the 6-row tiles; padding after
            if not 0 <= num_rows <= rows:
                continue
            got = np.asarray(call(jnp.asarray(x), jnp.int32(num_rows), jnp.asarray(pack_panels(weight))))
            expected = x[:num_rows].astype(np.float64) @ weight.astype(np.float64)
            np.testing.assert_allclose(got[:num_rows], expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))
            np.testing.assert_array_equal(got[num_rows:], 0.0)


@pytest.mark.parametrize("rows,num_rows", [(64, 0), (64, 1), (64, 5), (64, 6), (64, 7), (64, 61), (64, 64),
                                           (512, 500), (16, 99), (16, -3)])
def test_rows_from_num_rows_on_are_zeros_and_the_rest_is_the_product(rows, num_rows):
    # A step padded to its bucket multiplies only its real rows: the padding's results are zeros (whatever it held,
    # here NaN), the real rows' are the product. num_rows outside [0, rows] is clamped.
    rng = np.random.default_rng(rows + num_rows)
    inner, outer = 40, 48
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    real = min(max(num_rows, 0), rows)
    x[real:] = np.nan
    weight = rng.standard_normal((inner, outer)).astype(np.float32)
    product = jax.jit(packed_matmul)(jnp.asarray(x), jnp.asarray(pack_panels(weight)), num_rows=jnp.int32(num_rows))
    got = np.asarray(product)
    np.testing.assert_allclose(got[:real], x[:real].astype(np.float64) @ weight.astype(np.float64),
                               rtol=1e-5, atol=1e-5 * np.sqrt(inner))
    np.testing.assert_array_equal(got[real:], 0.0)


@pytest.mark.parametrize("rows,num_rows", [(1, 1), (64, 61), (73, 73), (150, 140)])
def test_weights_fused_into_one_call_give_each_product(rows, num_rows):
    # q, k and v (SmolLM2's widths, scaled down), then gate and up: one call's work items span every weight; each
    # result must be its own weight's product, whichever thread took which item.
    rng = np.random.default_rng(rows)
    inner = 72
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    for outers in [(144, 48, 48), (96, 96), (16, 32, 48, 64)]:
        weights = [rng.standard_normal((inner, outer)).astype(np.float32) for outer in outers]
        got = jax.jit(packed_matmuls)(jnp.asarray(x), [jnp.asarray(pack_panels(w)) for w in weights],
                                      num_rows=jnp.int32(num_rows))
        assert len(got) == len(weights)
        for product, weight in zip(got, weights):
            assert product.shape == (rows, weight.shape[1])
            np.testing.assert_allclose(np.asarray(product)[:num_rows],
                                       x[:num_rows].astype(np.float64) @ weight.astype(np.float64),
                                       rtol=1e-5, atol=1e-5 * np.sqrt(inner))
            np.testing.assert_array_equal(np.asarray(product)[num_rows:], 0.0)


def test_a_fused_call_refuses_mixed_dtypes_and_too_many_weights():
    panels = jnp.zeros((1, 8, 16), jnp.float32)
    with pytest.raises(ValueError, match="weights of one dtype"):
        packed_matmuls(jnp.zeros((2, 8)), [panels, panels.astype(jnp.bfloat16)])
    with pytest.raises(ValueError, match="1 to 4 weights"):
        packed_matmuls(jnp.zeros((2, 8)), [panels] * 5)


def test_every_output_column_comes_from_its_own_weight_column():
    # A one-hot weight picks input column j into output column perm[j]: a panel or lane mixed up moves a value.
    inner, outer = 40, 96
    perm = np.random.default_rng(0).permutation(outer)[:inner]
    weight = np.zeros((inner, outer), np.float32)
    weight[np.arange(inner), perm] = 1.0
    x = np.arange(13 * inner, dtype=np.float32).reshape(13, inner)
    got = np.asarray(packed_matmul(jnp.asarray(x), jnp.asarray(pack_panels(weight))))
    expected = np.zeros((13, outer), np.float32)
    expected[:, perm] = x
    np.testing.assert_array_equal(got, expected)


def test_packing_round_trips_and_refuses_partial_panels():
    weight = np.random.default_rng(1).standard_normal((7, 48)).astype(np.float32)
    panels = pack_panels(weight)
    assert panels.shape == (3, 7, 16)
    np.testing.assert_array_equal(panels[1, 2], weight[2, 16:32])
    np.testing.assert_array_equal(unpack_panels(panels), weight)
    as_checkpoints_store_it = np.ascontiguousarray(weight.T).T  # a transposed view of a row-major [outer, inner]
    np.testing.assert_array_equal(pack_panels(as_checkpoints_store_it), panels)
    assert fills_whole_panels((7, 48)) and not fills_whole_panels((7, 50)) and not fills_whole_panels((7, 0))
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_panels(np.zeros((7, 50), np.float32))


def test_bfloat16_packing_pairs_inner_indices_and_round_trips():
    weight = np.random.default_rng(2).standard_normal((6, 32)).astype(jnp.bfloat16)
    panels = pack_panels(weight)
    assert panels.shape == (2, 6, 16) and panels.dtype == jnp.bfloat16
    # Panel 1, pair row 1 (inner 2 and 3): (W[2, c], W[3, c]) for columns c = 16 .. 31 in turn.
    row = panels[1].reshape(3, 32)[1]
    np.testing.assert_array_equal(row[0::2], weight[2, 16:32])
    np.testing.assert_array_equal(row[1::2], weight[3, 16:32])
    np.testing.assert_array_equal(unpack_panels(panels), weight)
    columns = jnp.asarray([0, 17, 31])
    for packed in (panels, pack_panels(weight.astype(np.float32))):
        np.testing.assert_array_equal(np.asarray(panel_columns(jnp.asarray(packed), columns)).astype(np.float32),
                                      weight.T[[0, 17, 31]].astype(np.float32))
    assert fills_whole_panels((6, 32), jnp.bfloat16) and not fills_whole_panels((7, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="inner size even"):
        pack_panels(np.zeros((7, 32), jnp.bfloat16))


needs_avx512_bf16 = pytest.mark.skipif(not packed_bfloat16_available(),
                                       reason="the bfloat16 kernel is built only where the CPU has AVX512-BF16")


@needs_avx512_bf16
@pytest.mark.parametrize("rows", [0, 1, 11, 12, 13, 64, 73])
@pytest.mark.parametrize("inner,outer", [(2, 16), (24, 64), (64, 80), (100, 144)])
def test_the_bfloat16_product_equals_float64(rows, inner, outer):
    # bfloat16 products are exact in float32; only the float32 sums round.
    rng = np.random.default_rng(rows * 1000 + inner + outer)
    x = rng.standard_normal((rows, inner)).astype(jnp.bfloat16)
    weight = rng.standard_normal((inner, outer)).astype(jnp.bfloat16)
    panels = jnp.asarray(pack_panels(weight))
    got = np.asarray(packed_matmul(jnp.asarray(x), panels))
    assert got.shape == (rows, outer) and got.dtype == np.float32
    expected = x.astype(np.float64) @ weight.astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))
    # A bfloat16 result is the same sums rounded to nearest even, as XLA's convert rounds them.
    rounded = np.asarray(packed_matmul(jnp.asarray(x), panels, jnp.bfloat16))
    assert rounded.dtype == jnp.bfloat16
    np.testing.assert_array_equal(rounded, np.asarray(jnp.asarray(got).astype(jnp.bfloat16)))


@needs_avx512_bf16
def test_every_bfloat16_output_column_comes_from_its_own_weight_column():
    inner, outer = 40, 96
    perm = np.random.default_rng(0).permutation(outer)[:inner]
    weight = np.zeros((inner, outer), jnp.bfloat16)
    weight[np.arange(inner), perm] = 1.0
    x = np.arange(13 * inner).reshape(13, inner).astype(jnp.bfloat16)  # integers below 256: exact in bfloat16
    got = np.asarray(packed_matmul(jnp.asarray(x), jnp.asarray(pack_panels(weight))))
    expected = np.zeros((13, outer), np.float32)
    expected[:, perm] = x.astype(np.float32)
    np.testing.assert_array_equal(got, expected)


def test_bfloat16_weights_pack_only_with_avx512_bf16_and_without_amx(monkeypatch):
    from jaxpaged.kernels.cpu_native import packed_matmul as module

    decide = module.packed_bfloat16_available.__wrapped__  # uncached: the real verdict stays as it is
    for flags in ("avx2 fma", "avx512f avx512_bf16 amx_bf16 amx_tile"):
        monkeypatch.setattr(module, "cpu_identity", lambda flags=flags: f"x86_64\nmodel name: test\nflags: {flags}")
        assert decide() is False

"""Shared pieces of the kernel tests: named ragged batches and a kernel-vs-spec checker."""

import dataclasses
from typing import Optional

import numpy as np
import pytest


def ragged_scenarios(page_size: int, **shape) -> list:
    """Named batches that all share one padded shape, so a kernel compiles once for all of them.

    Covers decode-only, prefill-only (fresh and chunked), mixed, kv lengths 1, page-1, page,
    page+1 and many pages, padded rows and sequences, an all-padding step, shuffled page ids.
    """
    from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch

    p = page_size
    padded = dict(num_tokens=80, max_num_seqs=6, pages_per_seq=8, num_pages=24, page_size=p)
    cases = {
        "decode_edges": ([1, 1, 1, 1, 1], [1, p - 1, p, p + 1, 5 * p + 3]),
        "prefill": ([p + 1, 3, 5], [p + 1, 3, 3 * p + 2]),
        "mixed": ([1, 7, 1, 2 * p + 3], [4 * p + 1, 7, p, 3 * p]),
        "many_pages": ([1, 40], [8 * p, 40 + p]),
    }
    batches = [(name, make_ragged_batch(q_lens, kv_lens, seed=seed, **padded, **shape))
               for seed, (name, (q_lens, kv_lens)) in enumerate(cases.items())]
    empty = make_ragged_batch([2], [2], seed=9, **padded, **shape)
    batches.append(("no_sequences", dataclasses.replace(empty, num_seqs=np.zeros(1, np.int32))))
    return batches


@pytest.fixture(scope="session")
def scenarios():
    """ragged_scenarios, as a fixture for the kernel test files."""
    return ragged_scenarios



TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}

ONE_SHOT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
"""XLA:CPU options for a kernel test's programs, each compiled for a few calls on small inputs: LLVM's optimisation
of an interpreted Pallas kernel (mostly callbacks) or of the jnp attention passes at these sizes buys no run time and
costs compile time (measured on the 2-core Zen 4: the jnp passes' compile 1.55 -> 0.72 s of CPU, an interpreted TPU
decode step's 3.7 -> 2.9 s; run times within noise). Not for engine steps, whose runs it slows (docs/testing.md)."""


def jit_one_shot(fn, **jit_options):
    """jax.jit with ONE_SHOT_COMPILER_OPTIONS: a kernel test's program, compiled once and called a few times."""
    import jax

    return jax.jit(fn, compiler_options=ONE_SHOT_COMPILER_OPTIONS, **jit_options)


def check_kernel_against_spec(kernel, page_size: int, head_dim: int, num_q_heads: int,
                                   num_kv_heads: int, dtype, *, sm_scale: float,
                                   sliding_window: Optional[int] = None,
                                   soft_cap: Optional[float] = None) -> None:
    """Every ragged scenario: kernel == spec within the dtype's tolerance, zeros on padding.

    `kernel` takes (q, kv_pages, metadata) and the attention options; it is jitted here once and
    must compile once for all scenarios (they share one padded shape).
    """
    import jax.numpy as jnp

    from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec

    options = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)
    jitted_kernel = jit_one_shot(lambda *args: kernel(*args, **options))
    tolerance = TOLERANCE[jnp.dtype(dtype).name]
    for name, batch in ragged_scenarios(page_size, num_q_heads=num_q_heads,
                                        num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype):
        args = batch.attention_args()
        out = jitted_kernel(*args)
        assert out.dtype == jnp.dtype(dtype) and out.shape == batch.q.shape, name
        out = np.asarray(out).astype(np.float32)  # on the host: an eager astype compiles a program per shape
        expected = ragged_paged_attention_spec(*args, **options)
        np.testing.assert_allclose(out, expected, atol=tolerance, rtol=tolerance, err_msg=name)
        num_real_tokens = batch.cu_q_lens[batch.num_seqs[0]]
        assert np.all(out[num_real_tokens:] == 0), f"{name}: padding rows must be zeros"
    assert jitted_kernel._cache_size() == 1, "one compile must serve every scenario"  # pyright: ignore[reportAttributeAccessIssue]


def check_kernel_config(check_kernel, kernel_fn, page_size: int, head_dim: int, num_q_heads: int,
                        num_kv_heads: int, dtype, options: dict, **fixed) -> None:
    """Split a test config's options into attention options and the kernel's block options, then check it.

    `fixed` (e.g. interpret=True) goes to kernel_fn with the block options.
    """
    import functools

    attention = {k: options[k] for k in ("sliding_window", "soft_cap") if k in options}
    blocks = {k: v for k, v in options.items() if k not in attention}
    kernel = functools.partial(kernel_fn, **fixed, **blocks)
    check_kernel(kernel, page_size, head_dim, num_q_heads, num_kv_heads, dtype, sm_scale=head_dim ** -0.5,
                 **attention)


@pytest.fixture(scope="session")
def check_kernel():
    """check_kernel_against_spec, as a fixture for the kernel test files."""
    return check_kernel_against_spec


def abstract_step(kernel, num_tokens: int, num_q_heads: int, head_dim: int, num_pages: int, page_size: int,
                  kv_heads_x2: int, max_num_seqs: int, pages_per_seq: int, dtype):
    """(jitted fn, abstract args) for tracing/lowering `kernel(q, kv_pages, metadata)` without data.

    The metadata is rebuilt from abstract int32 fields inside the traced function: the fields are then
    tracers (jax.Array), which the run-time jaxtyping checks accept, unlike ShapeDtypeStructs.
    """
    import jax
    import jax.numpy as jnp

    from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata

    fields = [jax.ShapeDtypeStruct(shape, jnp.int32) for shape in (
        (num_tokens,), (max_num_seqs,), (max_num_seqs, pages_per_seq), (max_num_seqs + 1,), (1,))]
    args = (jax.ShapeDtypeStruct((num_tokens, num_q_heads, head_dim), dtype),
            jax.ShapeDtypeStruct((num_pages, page_size, kv_heads_x2, head_dim), dtype), *fields)
    return jax.jit(lambda q, kv_pages, *fields: kernel(q, kv_pages, AttentionMetadata(*fields))), args


# (num_q_heads, num_kv_heads, head_dim) of real models: SmolLM2-135M, Llama-3-8B, a 16/2 GQA-8 model.
REAL_SHAPES = [(9, 3, 64), (32, 8, 128), (16, 2, 128)]

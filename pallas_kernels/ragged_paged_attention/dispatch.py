"""The attention backend switch: validate inputs once, then run the reference or a Pallas kernel.

Backends: "xla" (the pure-jnp reference, the CPU path), "pallas_tpu" (Mosaic), "pallas_gpu" (Triton
lowering); "auto" picks by `jax.default_backend()`. A Pallas backend asked for on a platform it was
not written for runs in its interpret mode, so the whole engine can be checked on a CPU.
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pallas_kernels.ragged_paged_attention.reference import (
    ragged_paged_attention_reference,
    write_kv_pages,
)

ATTENTION_BACKENDS = ("auto", "xla", "pallas_tpu", "pallas_gpu")
_AUTO_BY_PLATFORM = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu",
                     "rocm": "pallas_gpu"}


def resolve_attention_backend(name: str) -> str:
    """"auto" -> "pallas_tpu" on TPU, "pallas_gpu" on GPU, "xla" elsewhere; other names pass through."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend: must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        return _AUTO_BY_PLATFORM.get(jax.default_backend(), "xla")
    return name


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


def validate_attention_inputs(q, kv_pages, kv_lens, block_tables, cu_q_lens, num_seqs, *,
                              sm_scale, sliding_window, soft_cap) -> None:
    """Shape, dtype and option checks, at trace time; ValueError says which input and what it got."""
    for name, array, rank in (("q", q, 3), ("kv_pages", kv_pages, 4), ("kv_lens", kv_lens, 1),
                              ("block_tables", block_tables, 2), ("cu_q_lens", cu_q_lens, 1)):
        _require(array.ndim == rank, name, f"must have rank {rank}, got shape {array.shape}")
    _require(num_seqs.shape in ((), (1,)), "num_seqs", f"must have shape (1,), got {num_seqs.shape}")
    for name, array in (("q", q), ("kv_pages", kv_pages)):
        _require(jnp.issubdtype(array.dtype, jnp.floating), name,
                 f"must be floating point, got {array.dtype}")
    _require(q.dtype == kv_pages.dtype, "kv_pages",
             f"dtype must equal q's ({q.dtype}), got {kv_pages.dtype}")
    for name, array in (("kv_lens", kv_lens), ("block_tables", block_tables),
                        ("cu_q_lens", cu_q_lens), ("num_seqs", num_seqs)):
        _require(jnp.issubdtype(array.dtype, jnp.integer), name,
                 f"must be an integer array, got {array.dtype}")
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, kv_heads_x2, kv_head_dim = kv_pages.shape
    _require(kv_head_dim == head_dim, "kv_pages",
             f"head_dim {kv_head_dim} differs from q's head_dim {head_dim} (shapes {kv_pages.shape}"
             f" and {q.shape})")
    _require(kv_heads_x2 >= 2 and kv_heads_x2 % 2 == 0, "kv_pages",
             f"axis 2 must hold 2 * num_kv_heads (K/V interleaved), got {kv_heads_x2}")
    _require(num_q_heads % (kv_heads_x2 // 2) == 0, "q",
             f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {kv_heads_x2 // 2}")
    max_num_seqs = kv_lens.shape[0]
    _require(block_tables.shape[0] == max_num_seqs, "block_tables",
             f"must have {max_num_seqs} rows like kv_lens, got shape {block_tables.shape}")
    _require(cu_q_lens.shape[0] == max_num_seqs + 1, "cu_q_lens",
             f"must have max_num_seqs + 1 = {max_num_seqs + 1} entries, got shape {cu_q_lens.shape}")
    _require(isinstance(sm_scale, (int, float)) and sm_scale > 0, "sm_scale",
             f"must be a positive float, got {sm_scale!r}")
    _require(sliding_window is None or (isinstance(sliding_window, int) and sliding_window >= 1),
             "sliding_window", f"must be None or a positive int, got {sliding_window!r}")
    _require(soft_cap is None or (isinstance(soft_cap, (int, float)) and soft_cap > 0), "soft_cap",
             f"must be None or a positive float, got {soft_cap!r}")


def ragged_paged_attention(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: Float[Array, "num_pages page_size kv_heads_x2 head_dim"],
    kv_lens: Int[Array, "max_num_seqs"],
    block_tables: Int[Array, "max_num_seqs pages_per_seq"],
    cu_q_lens: Int[Array, "max_num_seqs_plus_1"],
    num_seqs: Int[Array, "1"],
    *,
    backend: str,
    sm_scale: float,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """Ragged paged attention through the chosen backend (see the reference for the semantics)."""
    backend = resolve_attention_backend(backend)
    validate_attention_inputs(q, kv_pages, kv_lens, block_tables, cu_q_lens, num_seqs,
                              sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)
    metadata = [jnp.asarray(a, jnp.int32) for a in (kv_lens, block_tables, cu_q_lens)]
    num_seqs = jnp.asarray(num_seqs, jnp.int32).reshape(1)
    options = dict(sm_scale=float(sm_scale), sliding_window=sliding_window,
                   soft_cap=None if soft_cap is None else float(soft_cap))
    if backend == "xla":
        return ragged_paged_attention_reference(q, kv_pages, *metadata, num_seqs, **options)
    if backend == "pallas_tpu":
        from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu
        return ragged_paged_attention_tpu(q, kv_pages, *metadata, num_seqs,
                                          interpret=jax.default_backend() != "tpu", **options)
    from pallas_kernels.ragged_paged_attention.gpu import ragged_paged_attention_gpu
    return ragged_paged_attention_gpu(q, kv_pages, *metadata, num_seqs,
                                      interpret=jax.default_backend() != "gpu", **options)


def write_kv(
    kv_pages: Float[Array, "num_pages page_size kv_heads_x2 head_dim"],
    k: Float[Array, "num_tokens num_kv_heads head_dim"],
    v: Float[Array, "num_tokens num_kv_heads head_dim"],
    slot_mapping: Int[Array, "num_tokens"],
    *,
    backend: str,
) -> Float[Array, "num_pages page_size kv_heads_x2 head_dim"]:
    """Write the step's K/V into their slots (slot = page_id * page_size + offset) for the backend."""
    _require(k.shape == v.shape and k.ndim == 3, "k", f"k and v must both be [num_tokens, "
             f"num_kv_heads, head_dim], got {k.shape} and {v.shape}")
    _require(kv_pages.ndim == 4 and kv_pages.shape[2:] == (2 * k.shape[1], k.shape[2]), "kv_pages",
             f"must be [num_pages, page_size, {2 * k.shape[1]}, {k.shape[2]}], got {kv_pages.shape}")
    _require(slot_mapping.shape == (k.shape[0],), "slot_mapping",
             f"must be [{k.shape[0]}], got {slot_mapping.shape}")
    if resolve_attention_backend(backend) == "pallas_tpu":
        # XLA's TPU scatter is a serial loop of row updates; the kernel DMAs every row at once.
        from pallas_kernels.ragged_paged_attention.kv_write_tpu import write_kv_pages_tpu
        return write_kv_pages_tpu(kv_pages, k, v, slot_mapping,
                                  interpret=jax.default_backend() != "tpu")
    # XLA's scatter on CPU and GPU: in place on the donated cache, one parallel pass over new rows.
    return write_kv_pages(kv_pages, k, v, slot_mapping)

"""The attention backend switch: validate inputs once, then run the chosen implementation.

Backends: "xla" (xla_attention.py, the jnp CPU path), "pallas_tpu" (Mosaic), "pallas_gpu" (Triton lowering);
"auto" picks by the target platform (target_platform: the default device's, so a step traced for a TPU
topology's device on a CPU machine compiles the TPU kernels for libtpu). A Pallas backend asked for on a
platform it was not written for runs in its interpret mode, so the whole engine can be checked on a CPU.
Every backend computes what spec.py spells out.

KV layouts (kv_layout.py): every backend reads the interleaved [num_pages, page_size, 2 * num_kv_heads,
head_dim] cache; "pallas_tpu" also reads and writes the packed uint32 [num_pages, page_size * rows, 128]
cache (no TPU tile padding), which needs num_kv_heads passed along since the shape no longer says it; "xla"
also reads and writes the interleaved cache as bfloat16 bits (uint16; XLA:CPU's bfloat16 scatter is not in place),
and the quantized one (int8 / uint8 rows of codes and a scale: kv_cache_dtype "int8" / "fp8_e4m3"). For those
formats "pallas_tpu" reads and writes the packed quantized uint32 cache instead (kv_layout_quantized.py: 4 tokens'
codes per word, page scales in rows of their own), named by kv_cache_dtype and page_size since its rows do not say it.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from jaxpaged.kernels.xla_attention import ragged_paged_attention_xla, write_kv_pages
from pallas_kernels.bfloat16_bits import BITS_DTYPE
from pallas_kernels.kv_quantization import is_quantized_pool, pool_row_width
from pallas_kernels.ragged_paged_attention.kv_layout import KVPages, kernel_layout
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import write_kv_packed_quantized
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata, validate_attention_inputs

ATTENTION_BACKENDS = ("auto", "xla", "pallas_tpu", "pallas_gpu")
_AUTO_BY_PLATFORM = {"tpu": "pallas_tpu", "gpu": "pallas_gpu", "cuda": "pallas_gpu", "rocm": "pallas_gpu"}


def _packed_page_size(kv_pages, backend: str, num_kv_heads: Optional[int], head_dim: int, dtype,
                      kv_cache_dtype: str = "auto", page_size: Optional[int] = None) -> int:
    """The page size of a rank-3 cache, which must be the packed (or packed quantized) layout of these heads, for the
    one backend that reads it (ValueError naming the field otherwise: kv_layout.kernel_layout)."""
    if backend != "pallas_tpu":
        raise ValueError(f"kv_pages: the packed layout {kv_pages.shape} is read by pallas_tpu only, not {backend}")
    return kernel_layout(kv_pages, head_dim, dtype, num_kv_heads, kv_cache_dtype, page_size)[1]


def _require_bits_reader(kv_pages, backend: str) -> None:
    """bfloat16 bits (uint16 interleaved pages) are read and written by the "xla" backend only."""
    if kv_pages.ndim == 4 and kv_pages.dtype == BITS_DTYPE and backend != "xla":
        raise ValueError(f"kv_pages: the interleaved_bits layout (uint16) is read by the xla backend only, "
                         f"not {backend}")


def target_platform() -> str:
    """The platform the kernels are traced for: the default device's when one is set (a TPU topology's device
    while compiling ahead of time on a CPU machine, benchmarks/kernels/tpu_compile_check.py), else jax's default
    backend."""
    device = jax.config.jax_default_device  # pyright: ignore[reportAttributeAccessIssue]
    if isinstance(device, jax.Device):
        return device.platform
    if isinstance(device, str):
        return device
    return jax.default_backend()


QUANTIZED_KV_BACKENDS = ("xla", "pallas_gpu")
"""Backends that read and write the quantized layout (int8 / fp8 rows with their scales, kv_quantization.py);
pallas_tpu has its own, the packed quantized layout (kv_layout_quantized.py)."""
KV_CACHE_DTYPE_BACKENDS = (*QUANTIZED_KV_BACKENDS, "pallas_tpu")
"""Backends that run a quantized kv_cache_dtype in one layout or the other."""


def _require_quantized_reader(kv_pages, backend: str) -> None:
    """int8 / uint8 pages (quantized rows) are read and written by QUANTIZED_KV_BACKENDS only."""
    if kv_pages.ndim == 4 and is_quantized_pool(kv_pages.dtype) and backend not in QUANTIZED_KV_BACKENDS:
        raise ValueError(f"kv_pages: the quantized layout ({kv_pages.dtype}) is read by {QUANTIZED_KV_BACKENDS} "
                         f"only, not {backend}")


def resolve_attention_backend(name: str) -> str:
    """"auto" -> "pallas_tpu" on TPU, "pallas_gpu" on GPU, "xla" elsewhere; other names pass through."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend: must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        return _AUTO_BY_PLATFORM.get(target_platform(), "xla")
    return name


def check_kv_cache_dtype(kv_cache_dtype: str, attention_backend: str) -> None:
    """ValueError naming kv_cache_dtype when the backend (attention_backend resolved for this platform) cannot read a
    quantized cache: called at start-up, before any weight is read."""
    backend = resolve_attention_backend(attention_backend)
    if kv_cache_dtype != "auto" and backend not in KV_CACHE_DTYPE_BACKENDS:
        raise ValueError(f"kv_cache_dtype: {kv_cache_dtype!r} runs on the attention backends "
                         f"{KV_CACHE_DTYPE_BACKENDS}, not {backend} (attention_backend={attention_backend!r} on "
                         f"{jax.default_backend()}); use "
                         f"kv_cache_dtype='auto' or attention_backend='xla'")


def ragged_paged_attention(
    q: Float[Array, "num_tokens num_q_heads head_dim"],
    kv_pages: KVPages,
    metadata: AttentionMetadata,
    *,
    backend: str,
    sm_scale: float,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
    num_kv_heads: Optional[int] = None,
    native_decode: bool = True,
    kv_cache_dtype: str = "auto",
    page_size: Optional[int] = None,
    sinks: Optional[Float[Array, " num_q_heads"]] = None,
) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """Ragged paged attention through the chosen backend (spec.py gives the semantics).

    sinks: attention sinks (gpt-oss), one float32 logit per q head of q (this shard's heads under tensor
    parallelism) that joins the softmax's denominator only; None (most models) runs the programs without them.

    kv_pages may be the packed layout (backend "pallas_tpu" only; num_kv_heads required), or with a quantized
    kv_cache_dtype the packed quantized one (pallas_tpu; num_kv_heads and page_size required). `native_decode`: the
    "xla" backend on a CPU may read decode rows with the native kernel (False keeps every row on the jnp path).
    """
    backend = resolve_attention_backend(backend)
    sm_scale = float(sm_scale)
    soft_cap = None if soft_cap is None else float(soft_cap)
    options: dict[str, Any] = dict(sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)
    if sinks is not None:
        if sinks.shape != (q.shape[1],):
            raise ValueError(f"sinks: must be [num_q_heads] = [{q.shape[1]}] (one logit per q head), got "
                             f"{sinks.shape}")
        options["sinks"] = sinks.astype(jnp.float32)
    if kv_pages.ndim == 3:
        page_size = _packed_page_size(kv_pages, backend, num_kv_heads, q.shape[2], q.dtype, kv_cache_dtype,
                                      page_size)
        assert num_kv_heads is not None  # _packed_page_size refused None
        # The interleaved twin of the packed shape carries the same checks (shapes only, nothing is read).
        validate_attention_inputs(q, jnp.zeros((0, page_size, 2 * num_kv_heads, q.shape[2]), q.dtype), metadata,
                                  sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap)
        # Only on this path: the Mosaic kernel module (and jax's pallas.tpu under it) loads for pallas_tpu alone.
        from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu

        quantized = dict(kv_cache_dtype=kv_cache_dtype, page_size=page_size) if kv_cache_dtype != "auto" else {}
        return ragged_paged_attention_tpu(q, kv_pages, metadata, num_kv_heads=num_kv_heads,
                                          interpret=target_platform() != "tpu", **options, **quantized)
    _require_bits_reader(kv_pages, backend)
    _require_quantized_reader(kv_pages, backend)
    validate_attention_inputs(q, kv_pages, metadata, sm_scale=sm_scale, sliding_window=sliding_window,
                              soft_cap=soft_cap)
    if backend == "xla":
        return ragged_paged_attention_xla(q, kv_pages, metadata, native=native_decode, **options)
    if backend == "pallas_tpu":
        # Only on this platform's backend: the Mosaic kernel module (pallas.tpu) loads for pallas_tpu alone.
        from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu

        return ragged_paged_attention_tpu(q, kv_pages, metadata, interpret=target_platform() != "tpu",
                                          **options)
    # Only on this platform's backend: the Triton kernel module (pallas.triton) loads for pallas_gpu alone.
    from pallas_kernels.ragged_paged_attention.gpu import ragged_paged_attention_gpu

    return ragged_paged_attention_gpu(q, kv_pages, metadata, interpret=target_platform() != "gpu",
                                      **options)


def write_kv(
    kv_pages: KVPages,
    k: Float[Array, "num_tokens num_kv_heads head_dim"],
    v: Float[Array, "num_tokens num_kv_heads head_dim"],
    metadata: AttentionMetadata,
    *,
    backend: str,
    kv_cache_dtype: str = "auto",
    page_size: Optional[int] = None,
) -> KVPages:
    """Write the step's K/V into their slots (metadata.slot_mapping) with the backend's write (a packed quantized
    pool: kv_cache_dtype and page_size name it, kv_layout_quantized.py)."""
    if k.shape != v.shape or k.ndim != 3:
        raise ValueError(f"k: k and v must both be [num_tokens, num_kv_heads, head_dim], got {k.shape} and {v.shape}")
    if kv_pages.ndim == 3:
        _packed_page_size(kv_pages, resolve_attention_backend(backend), k.shape[1], k.shape[2], k.dtype,
                          kv_cache_dtype, page_size)
    elif kv_pages.ndim != 4 or kv_pages.shape[2:] != (2 * k.shape[1], pool_row_width(k.shape[2], kv_pages.dtype)):
        raise ValueError(f"kv_pages: must be [num_pages, page_size, {2 * k.shape[1]}, "
                         f"{pool_row_width(k.shape[2], kv_pages.dtype)}], got {kv_pages.shape}")
    _require_bits_reader(kv_pages, resolve_attention_backend(backend))
    _require_quantized_reader(kv_pages, resolve_attention_backend(backend))
    slot_mapping = metadata.slot_mapping
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping: must be [{k.shape[0]}], got {slot_mapping.shape}")
    if kv_pages.ndim == 3 and kv_cache_dtype != "auto":
        # 4 tokens share each word: quantize, then merge into the words (kv_layout_quantized.py).
        assert page_size is not None  # _packed_page_size refused None
        return write_kv_packed_quantized(kv_pages, k, v, slot_mapping, kv_cache_dtype, page_size)
    if resolve_attention_backend(backend) == "pallas_tpu" or kv_pages.ndim == 3:
        # XLA's TPU scatter is a serial loop of row updates; the kernel DMAs the rows instead. Imported only on this
        # path: the Mosaic write kernel (pallas.tpu) loads for pallas_tpu alone.
        from pallas_kernels.ragged_paged_attention.kv_write_tpu import write_kv_pages_tpu

        return write_kv_pages_tpu(kv_pages, k, v, slot_mapping, interpret=target_platform() != "tpu")
    # XLA's scatter on CPU and GPU: in place on the donated cache, one parallel pass over new rows.
    return write_kv_pages(kv_pages, k, v, slot_mapping)

"""AttentionMetadata: the one pytree every attention backend and the KV write take.

Vocabulary, shared by core/, runner/ and the kernels: a *page* is what the scheduler calls a *block*
(`block_size` tokens of K/V for one layer); `page_size == block_size`. A *slot* is one token's place in
the cache, `page_id * page_size + offset`. Page 0 is the null page: padding writes there and it is
never handed to a request. Shape names used in every signature:
  num_tokens     rows of the step's ragged token axis (a bucket size; padding included)
  max_num_seqs   sequence rows of the step (a bucket size; padding included)
  pages_per_seq  width of a block table row, ceil(max_model_len / page_size)
  num_pages      pages in the cache array the kernel sees (all layers' pages when they are stacked)
  kv_heads_x2    2 * num_kv_heads: K of head h at index 2h, V at 2h + 1
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, Shaped

from pallas_kernels.bfloat16_bits import BITS_DTYPE
from pallas_kernels.kv_quantization import SCALE_BYTES, is_quantized_pool, pool_row_width
from pallas_kernels.pytree import HostOrDeviceArray, register_pytree_dataclass

# Finite "minus infinity" for masked logits and running maxima: exp(MASK - MASK) stays 1, never NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)



@register_pytree_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """Where one step's tokens sit in the paged cache. Only the shapes are static under jit."""

    slot_mapping: Int[HostOrDeviceArray, " num_tokens"]
    """Slot each token's new K/V is written to; padding tokens write into the null page."""
    kv_lens: Int[HostOrDeviceArray, " max_num_seqs"]
    """KV length of each sequence after this step (its new tokens included); 0 for padded sequences."""
    block_tables: Int[HostOrDeviceArray, "max_num_seqs pages_per_seq"]
    """Page ids of each sequence, padded with the null page 0."""
    cu_q_lens: Int[HostOrDeviceArray, " max_num_seqs_plus_1"]
    """Sequence s owns token rows cu_q_lens[s]:cu_q_lens[s + 1]; padded sequences repeat the last offset."""
    num_seqs: Int[HostOrDeviceArray, " 1"]
    """How many sequences are real."""

    @property
    def max_num_seqs(self) -> int:
        return self.kv_lens.shape[0]

    def on_pages_from(self, first_page: Int[Array, ""], page_size: int) -> "AttentionMetadata":
        """The same step addressed into a stack of caches whose pages for this layer start at first_page.

        The model keeps every layer's pages in one array; shifting the ids (not the cache) means no layer
        is ever copied out of the stack.
        """
        return dataclasses.replace(self, slot_mapping=self.slot_mapping + first_page * page_size,
                                   block_tables=self.block_tables + first_page)


def empty_attention_metadata(num_tokens: int, max_num_seqs: int, pages_per_seq: int) -> AttentionMetadata:
    """A zero-filled host (numpy) metadata of the given shapes: no real sequence, every write to page 0."""
    zeros = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    return AttentionMetadata(slot_mapping=zeros(num_tokens), kv_lens=zeros(max_num_seqs),
                             block_tables=zeros(max_num_seqs, pages_per_seq), cu_q_lens=zeros(max_num_seqs + 1),
                             num_seqs=zeros(1))


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{field}: {message}")


def validate_attention_inputs(q: Float[Array, "num_tokens num_q_heads head_dim"],
                              kv_pages: Shaped[Array, "num_pages page_size kv_heads_x2 kv_row"],
                              metadata: AttentionMetadata, *, sm_scale: float, sliding_window, soft_cap) -> None:
    """Shape, dtype and option checks on shapes alone (so at trace time); ValueError names the input."""
    _require(isinstance(metadata, AttentionMetadata), "metadata",
             f"must be an AttentionMetadata, got {type(metadata).__name__}")
    arrays = (("q", q, 3), ("kv_pages", kv_pages, 4), ("kv_lens", metadata.kv_lens, 1),
              ("block_tables", metadata.block_tables, 2), ("cu_q_lens", metadata.cu_q_lens, 1),
              ("slot_mapping", metadata.slot_mapping, 1))
    for name, array, rank in arrays:
        _require(array.ndim == rank, name, f"must have rank {rank}, got shape {array.shape}")
    _require(metadata.num_seqs.shape in ((), (1,)), "num_seqs",
             f"must have shape (1,), got {metadata.num_seqs.shape}")
    # uint16 pages are bfloat16 bits (the "interleaved_bits" layout), int8 / uint8 pages quantized rows of codes and a
    # scale (the "quantized" layout, whatever q's dtype), kv_layout.py.
    quantized = is_quantized_pool(kv_pages.dtype)
    kv_dtype = jnp.dtype(jnp.bfloat16) if kv_pages.dtype == BITS_DTYPE else kv_pages.dtype
    for name, dtype in (("q", q.dtype), ("kv_pages", q.dtype if quantized else kv_dtype)):
        _require(jnp.issubdtype(dtype, jnp.floating), name, f"must be floating point, got {dtype}")
    _require(quantized or q.dtype == kv_dtype, "kv_pages", f"dtype must equal q's ({q.dtype}), got {kv_pages.dtype}")
    for field in dataclasses.fields(metadata):
        array = getattr(metadata, field.name)
        _require(jnp.issubdtype(array.dtype, jnp.integer), field.name,
                 f"must be an integer array, got {array.dtype}")
    num_tokens, num_q_heads, head_dim = q.shape
    _, _, kv_heads_x2, kv_head_dim = kv_pages.shape
    row_width = pool_row_width(head_dim, kv_pages.dtype)
    what = f"q's head_dim {head_dim} + {SCALE_BYTES} scale bytes" if quantized else f"q's head_dim {head_dim}"
    _require(kv_head_dim == row_width, "kv_pages",
             f"head_dim {kv_head_dim} differs from {what} (shapes {kv_pages.shape} and {q.shape})")
    _require(kv_heads_x2 >= 2 and kv_heads_x2 % 2 == 0, "kv_pages",
             f"axis 2 must hold 2 * num_kv_heads (K/V interleaved), got {kv_heads_x2}")
    _require(num_q_heads % (kv_heads_x2 // 2) == 0, "q",
             f"num_q_heads {num_q_heads} must be a multiple of num_kv_heads {kv_heads_x2 // 2}")
    max_num_seqs = metadata.max_num_seqs
    _require(metadata.block_tables.shape[0] == max_num_seqs, "block_tables",
             f"must have {max_num_seqs} rows like kv_lens, got shape {metadata.block_tables.shape}")
    _require(metadata.cu_q_lens.shape[0] == max_num_seqs + 1, "cu_q_lens",
             f"must have max_num_seqs + 1 = {max_num_seqs + 1} entries, got shape {metadata.cu_q_lens.shape}")
    _require(metadata.slot_mapping.shape[0] == num_tokens, "slot_mapping",
             f"must have one slot per q row ({num_tokens}), got shape {metadata.slot_mapping.shape}")
    _require(isinstance(sm_scale, (int, float)) and sm_scale > 0, "sm_scale",
             f"must be a positive float, got {sm_scale!r}")
    _require(sliding_window is None or (isinstance(sliding_window, int) and sliding_window >= 1),
             "sliding_window", f"must be None or a positive int, got {sliding_window!r}")
    _require(soft_cap is None or (isinstance(soft_cap, (int, float)) and soft_cap > 0), "soft_cap",
             f"must be None or a positive float, got {soft_cap!r}")

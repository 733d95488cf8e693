"""The TPU step split by case: decode-only, prefill-only and mixed steps each run the kernels that suit them.

A decode row wants the decode kernel (tpu_decode.py: its q head group is the whole MXU operand, its KV streams in
big live-only DMA blocks); a prefill chunk wants the tile kernel (tpu.py: q tiles of many tokens against KV chunks).
The tile kernel can run decodes too, but spends a whole q tile per decode sequence, nearly all of it masked. So each
step takes one of three branches of a lax.switch (shapes are static; which branch runs is data):
  - decode-only (every real sequence has one q row, or there is none): the decode kernel alone;
  - prefill-only (the first real sequence has more than one row): the tile kernel alone;
  - mixed: the leading run of one-row sequences through the decode kernel (told num_seqs = that run's length), the
    sequences after it through the tile kernel (told to start there, so its tiles over the decodes' rows fetch
    nothing), each row taken from the kernel that owns it.
The scheduler lists running requests (decodes, mostly) before new prefills, so the leading run is nearly every
decode of the step; a one-row sequence after a prefill goes through the tile kernel, which is exact, only slower.
"""

from collections.abc import Callable
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

STEP_CASES = (None, "decode", "general", "mixed")
"""ragged_paged_attention_tpu's `case`: None splits by case per step; the others force one branch."""


def leading_decodes(cu_q_lens: Int[Array, " max_num_seqs_plus_1"], num_seqs: Int[Array, " 1"]) -> Int[Array, ""]:
    """How many real sequences at the front of the step have exactly one q row."""
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    is_real_decode = (jnp.arange(q_lens.shape[0]) < num_seqs[0]) & (q_lens == 1)
    return jnp.sum(jnp.cumprod(is_real_decode.astype(jnp.int32)))


def attend_by_case(q: Float[Array, "num_tokens num_q_heads head_dim"], kv_pages, kv_lens: Int[Array, " max_num_seqs"],
                   block_tables: Int[Array, "max_num_seqs pages_per_seq"],
                   cu_q_lens: Int[Array, " max_num_seqs_plus_1"], num_seqs: Int[Array, " 1"], *,
                   decode: Callable, general: Callable,
                   case: Optional[str] = None) -> Float[Array, "num_tokens num_q_heads head_dim"]:
    """One step's attention through the kernels its case wants (`decode(q, kv_pages, kv_lens, block_tables, cu_q_lens,
    num_seqs)`, `general(..., num_seqs, first_seq)`); rows of no sequence are the tile kernel's zeros, or left to the
    caller in a decode-only step (tpu.py masks them)."""
    args = (q, kv_pages, kv_lens, block_tables, cu_q_lens, num_seqs)
    num_decodes = leading_decodes(cu_q_lens, num_seqs)
    num_real = jnp.clip(num_seqs[0], 0, kv_lens.shape[0])

    def decode_only():
        return decode(*args)

    def prefill_only():
        return general(*args)

    def mixed():
        decoded = decode(q, kv_pages, kv_lens, block_tables, cu_q_lens, num_decodes.reshape(1).astype(num_seqs.dtype))
        rest = general(*args, num_decodes)
        is_decode_row = jnp.arange(q.shape[0]) < cu_q_lens[num_decodes]
        return jnp.where(is_decode_row[:, None, None], decoded, rest)

    branches = {"decode": decode_only, "general": prefill_only, "mixed": mixed}
    if case is not None:
        return branches[case]()
    index = jnp.where(num_decodes >= num_real, 0, jnp.where(num_decodes == 0, 1, 2))
    return jax.lax.switch(index, [decode_only, prefill_only, mixed])

"""StepInputs: the device-side input pytree of one engine step (a ragged batch padded to a bucket).

Only the bucket sizes (num_tokens, num_seqs) are static: they are the array shapes. Every value is traced,
so a new mix of prompts, positions or block tables never triggers a compile.
"""

import dataclasses

import jax
import numpy as np
from jaxtyping import Array, Int


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepInputs:
    """One step's tokens and attention metadata; padded rows are harmless by construction."""

    token_ids: Int[Array, "num_tokens"]
    """All scheduled tokens of all sequences, concatenated; padding is token 0."""
    positions: Int[Array, "num_tokens"]
    """Absolute position of each token in its sequence."""
    slot_mapping: Int[Array, "num_tokens"]
    """KV slot (block * block_size + offset) each token's K/V is written to; padding writes the null block 0."""
    cu_q_lens: Int[Array, "num_seqs_plus_1"]
    """Sequence s owns token rows cu_q_lens[s]:cu_q_lens[s + 1]; padded sequences repeat the last offset."""
    kv_lens: Int[Array, "num_seqs"]
    """KV length of each sequence after this step; 0 for padded sequences."""
    block_tables: Int[Array, "num_seqs pages_per_seq"]
    """Block ids of each sequence, padded with the null block 0."""
    num_seqs: Int[Array, "1"]
    """How many sequences are real."""
    sample_indices: Int[Array, "num_seqs"]
    """Token row of the last token of the j-th sampled sequence; padded entries point at row 0."""


def empty_step_inputs(num_tokens: int, num_seqs: int, pages_per_seq: int) -> StepInputs:
    """A zero-filled host batch of the given bucket (numpy; filled by the model runner)."""
    zeros = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    return StepInputs(
        token_ids=zeros(num_tokens), positions=zeros(num_tokens), slot_mapping=zeros(num_tokens),
        cu_q_lens=zeros(num_seqs + 1), kv_lens=zeros(num_seqs), block_tables=zeros(num_seqs, pages_per_seq),
        num_seqs=zeros(1), sample_indices=zeros(num_seqs))

"""StepInputs: the device-side input pytree of one engine step (a ragged batch padded to a bucket).

Only the bucket sizes (num_tokens, max_num_seqs) are static: they are the array shapes. Every value is traced,
so a new mix of prompts, positions or block tables never triggers a compile.
"""

import dataclasses

import numpy as np
from jaxtyping import Int

from pallas_kernels.ragged_paged_attention import AttentionMetadata, empty_attention_metadata
from pallas_kernels.ragged_paged_attention.metadata import HostOrDeviceArray, register_pytree_dataclass


@register_pytree_dataclass
@dataclasses.dataclass
class StepInputs:
    """One step's tokens, where their K/V goes and which rows are sampled; padded rows are harmless."""

    token_ids: Int[HostOrDeviceArray, " num_tokens"]
    """All scheduled tokens of all sequences, concatenated; padding is token 0."""
    positions: Int[HostOrDeviceArray, " num_tokens"]
    """Absolute position of each token in its sequence."""
    attention: AttentionMetadata
    """Slots, KV lengths, block tables, query offsets and the real sequence count."""
    sample_indices: Int[HostOrDeviceArray, " max_num_seqs"]
    """Token row of the last token of the j-th sampled sequence; padded entries point at row 0."""
    prompt_logprob_targets: Int[HostOrDeviceArray, " num_tokens"]
    """Prompt logprobs: the next prompt token, whose logprob this row's logits give, or -1 (the usual case: the
    step then skips the whole-vocabulary projection of every row)."""


def empty_step_inputs(num_tokens: int, max_num_seqs: int, pages_per_seq: int) -> StepInputs:
    """A zero-filled host batch of the given bucket (numpy; filled by the model runner)."""
    return StepInputs(token_ids=np.zeros(num_tokens, np.int32), positions=np.zeros(num_tokens, np.int32),
                      attention=empty_attention_metadata(num_tokens, max_num_seqs, pages_per_seq),
                      sample_indices=np.zeros(max_num_seqs, np.int32),
                      prompt_logprob_targets=np.full(num_tokens, -1, np.int32))

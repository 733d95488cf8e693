"""StepInputs: the device-side input pytree of one engine step (a ragged batch padded to a bucket).

Only the bucket sizes (num_tokens, max_num_seqs) are static: they are the array shapes. Every value is traced,
so a new mix of prompts, positions or block tables never triggers a compile. The host fills a numpy StepInputs and
sends it as one int32 array (pack_step_inputs); the compiled step cuts it back into StepInputs by the bucket's
static PackedLayout.
"""

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from jaxpaged.core.scheduler_output import ScheduledRequest
from jaxpaged.runner.buckets import Bucket
from jaxpaged.runner.host_block_table import HostBlockTable
from pallas_kernels.pytree import HostOrDeviceArray, register_pytree_dataclass
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata, empty_attention_metadata


@register_pytree_dataclass
@dataclasses.dataclass
class GroupTables:
    """KV layer groups (runner/kv_spec.py): every group's block tables and K/V write slots; a layer reads its group's
    (group 0's are also the attention metadata's)."""

    block_tables: Int[HostOrDeviceArray, "num_groups max_num_seqs pages_per_seq"]
    slot_mapping: Int[HostOrDeviceArray, "num_groups num_tokens"]


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
    """Token rows whose logits are sampled, in increasing order: the last token of each sampling sequence (and,
    with speculative decoding, each row verifying a proposal before it: the scheduler keeps sequences plus proposals
    within max_num_seqs); padded entries point at row 0."""
    prompt_logprob_targets: Int[HostOrDeviceArray, " num_tokens"]
    """Prompt logprobs: the next prompt token, whose logprob this row's logits give, or -1 (the usual case: the
    step then skips the whole-vocabulary projection of every row)."""
    token_sources: Int[HostOrDeviceArray, " num_tokens"]
    """Async scheduling: the row of the previous step's sampled ids that is this row's token (placed there on the
    device, since the host has not seen it yet), or -1: token_ids holds it (every row, without async)."""
    lora_slots: Int[HostOrDeviceArray, " num_tokens"]
    """Each row's LoRA adapter slot (lora/slots.py), 0 for the base model and for padding: per token row, since a
    step holds rows of several sequences, each with its own adapter."""
    group_tables: Optional[GroupTables] = None
    """Several KV layer groups: each group's block tables and slots; None (no leaves) with one group."""

    def num_sampled_rows(self) -> Int[Array, ""]:
        """How many leading entries of sample_indices are real (on the device, traced): one past the last entry
        that points past row 0. Real entries are the sampled sequences' last rows, in increasing order, so only the
        first can be row 0; padding is 0. A step that samples nothing counts one row (harmless: row 0's logits)."""
        indices = jnp.asarray(self.sample_indices)
        positions = jnp.arange(1, indices.shape[0] + 1, dtype=jnp.int32)
        return jnp.max(jnp.where(indices > 0, positions, 1))


def empty_step_inputs(num_tokens: int, max_num_seqs: int, blocks_per_seq: int, num_groups: int = 1) -> StepInputs:
    """A host batch of the given bucket (numpy, filled by the model runner): token ids, positions and attention
    metadata zero, prompt-logprob targets and token sources -1. Every field is a view of one int32 array, laid out
    as pack_step_inputs sends it, so sending the batch copies nothing: one allocation a step instead of eight and
    a concatenation."""
    template, treedef, spans = _packed_template(num_tokens, max_num_seqs, blocks_per_seq, num_groups)
    packed = template.copy()  # fresh each step: the array sent before may still be read by the device
    batch = jax.tree.unflatten(treedef, [packed[start:end].reshape(shape) for start, end, shape in spans])
    batch.__dict__[_PACKED] = packed  # not a field: pytree flattening leaves it out
    return batch


_PACKED = "_packed_fields"
"""The attribute of a StepInputs from empty_step_inputs that holds the one array its fields are views of."""


@functools.lru_cache(maxsize=64)
def _packed_template(num_tokens: int, max_num_seqs: int, blocks_per_seq: int, num_groups: int = 1):
    """The packed array of an empty batch of one bucket, the batch's treedef, and each field's span in the array."""
    group_tables = None
    if num_groups > 1:
        group_tables = GroupTables(np.zeros((num_groups, max_num_seqs, blocks_per_seq), np.int32),
                                   np.zeros((num_groups, num_tokens), np.int32))
    fields = StepInputs(token_ids=np.zeros(num_tokens, np.int32), positions=np.zeros(num_tokens, np.int32),
                        attention=empty_attention_metadata(num_tokens, max_num_seqs, blocks_per_seq),
                        sample_indices=np.zeros(max_num_seqs, np.int32),
                        prompt_logprob_targets=np.full(num_tokens, -1, np.int32),
                        token_sources=np.full(num_tokens, -1, np.int32), lora_slots=np.zeros(num_tokens, np.int32),
                        group_tables=group_tables)
    leaves, treedef = jax.tree.flatten(fields)
    ends = np.cumsum([leaf.size for leaf in leaves]).tolist()
    spans = tuple((end - leaf.size, end, leaf.shape) for leaf, end in zip(leaves, ends))
    template = np.concatenate([leaf.reshape(-1) for leaf in leaves])
    template.flags.writeable = False
    return template, treedef, spans


def fill_step_inputs(scheduled: Sequence[ScheduledRequest], bucket: Bucket, block_table: HostBlockTable,
                     block_size: int, group_block_tables: Sequence[HostBlockTable] = (),
                     lora_slots: Optional[Sequence[int]] = None) -> StepInputs:
    """The scheduled requests laid out in a zero-padded host batch of the bucket's shapes; `block_table` (the
    runner's, kept between steps) is brought up to date and copied in. `lora_slots`: each scheduled request's
    LoRA slot, written on its rows (None: every row the base model's).

    Each field is gathered in a Python list and converted once. This runs with cold caches (the device step has
    just streamed the weights through them), where what counts is how much code and data a step touches: a numpy
    call per request and field, and numpy-vectorised filling (every numpy call is cold code), both measured slower
    than this loop (docs/performance.md). With KV layer groups, `group_block_tables` (one per group after the
    first) fill the group tables.
    """
    num_groups = 1 + len(group_block_tables)
    batch = empty_step_inputs(bucket.num_tokens, bucket.num_seqs, block_table.table.shape[1], num_groups)
    attention = batch.attention
    num_seqs = len(scheduled)
    attention.block_tables[:num_seqs] = block_table.update([item.block_ids for item in scheduled])[:num_seqs]
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    kv_lens: list[int] = []
    query_ends: list[int] = []
    sample_rows: list[int] = []
    for item in scheduled:
        start, block_ids, num_new = item.start_position, item.block_ids, len(item.token_ids)
        token_ids += item.token_ids
        end = start + num_new
        if num_new == 1:  # a decode, the common case
            positions.append(start)
            slots.append(block_ids[start // block_size] * block_size + start % block_size)
        else:
            span = range(start, end)
            positions += span
            slots += [block_ids[position // block_size] * block_size + position % block_size for position in span]
        kv_lens.append(end)
        query_ends.append(len(token_ids))
        if item.sample:
            if item.num_spec_tokens:  # its newest token's row and each proposal's
                sample_rows += range(len(token_ids) - 1 - item.num_spec_tokens, len(token_ids))
            else:
                sample_rows.append(len(token_ids) - 1)
    num_tokens = len(token_ids)
    batch.token_ids[:num_tokens] = token_ids
    batch.positions[:num_tokens] = positions
    attention.slot_mapping[:num_tokens] = slots
    attention.kv_lens[:num_seqs] = kv_lens
    attention.cu_q_lens[1:num_seqs + 1] = query_ends
    attention.cu_q_lens[num_seqs + 1:] = num_tokens
    attention.num_seqs[0] = num_seqs
    batch.sample_indices[:len(sample_rows)] = sample_rows
    if batch.group_tables is not None:
        _fill_group_tables(batch.group_tables, scheduled, group_block_tables, attention, block_size)
    if lora_slots is not None and any(lora_slots):
        starts = [0, *query_ends]
        for seq_index, slot in enumerate(lora_slots):
            if slot:
                batch.lora_slots[starts[seq_index]:starts[seq_index + 1]] = slot
    return batch


def _fill_group_tables(group_tables: GroupTables, scheduled: Sequence[ScheduledRequest],
                       group_block_tables: Sequence[HostBlockTable], attention: AttentionMetadata,
                       block_size: int) -> None:
    """Group 0 as the attention metadata has it; each further group's tables and the slots of its blocks."""
    num_seqs = len(scheduled)
    group_tables.block_tables[0] = attention.block_tables
    group_tables.slot_mapping[0] = attention.slot_mapping
    for group, host_table in enumerate(group_block_tables, start=1):
        if any(len(item.group_block_ids) <= group for item in scheduled):
            raise ValueError(f"group_block_ids: the pool has {len(group_block_tables) + 1} KV cache groups; every "
                             f"scheduled request needs a block table for each")
        lists = [item.group_block_ids[group] for item in scheduled]
        group_tables.block_tables[group, :num_seqs] = host_table.update(lists)[:num_seqs]
        slots: list[int] = []
        for item, block_ids in zip(scheduled, lists):
            start = item.start_position
            slots += [block_ids[position // block_size] * block_size + position % block_size
                      for position in range(start, start + len(item.token_ids))]
        group_tables.slot_mapping[group, :len(slots)] = slots


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """Where each StepInputs field lies in the one int32 array a step's inputs travel in: a static argument of the
    compiled step (one per bucket), which cuts the array back into the fields on the device.

    Why one array: each field of the 10-field pytree would be a transfer of its own, with its own bookkeeping; one
    array of the same ints costs a fraction of that (docs/performance.md has the figures)."""

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, batch: StepInputs) -> "PackedLayout":
        """The layout of batches shaped like `batch` (its bucket's)."""
        leaves, treedef = jax.tree.flatten(batch)
        return cls(treedef, tuple(tuple(leaf.shape) for leaf in leaves))


def pack_step_inputs(batch: StepInputs) -> Int[np.ndarray, " total"]:
    """Every field of a host batch, flattened in pytree order, in one int32 array (PackedLayout.of(batch) reads it).
    The fields of a batch from empty_step_inputs already lie so in one array: that array is returned, not copied
    (unless a field was replaced by an array of its own since)."""
    leaves = jax.tree.leaves(batch)
    assert all(leaf.dtype == np.int32 for leaf in leaves), [leaf.dtype for leaf in leaves]
    packed = batch.__dict__.get(_PACKED)
    if packed is not None and all(leaf.base is packed for leaf in leaves):
        return packed
    return np.concatenate([leaf.reshape(-1) for leaf in leaves])


def unpack_step_inputs(packed: Int[Array, " total"], layout: PackedLayout) -> StepInputs:
    """pack_step_inputs undone, inside the jitted step: static slices of the one array, reshaped into the fields."""
    leaves, offset = [], 0
    for shape in layout.shapes:
        size = math.prod(shape)
        leaves.append(packed[offset:offset + size].reshape(shape))
        offset += size
    return jax.tree.unflatten(layout.treedef, leaves)

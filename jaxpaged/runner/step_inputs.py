"""StepInputBuilder: the host side of a step, in numpy only: the scheduled requests padded into their bucket as one
ragged batch (batch.py), the block table kept between steps (host_block_table.py), which rows take their token from
the previous step's sampled ids (async scheduling) and which rows target a prompt token (prompt logprobs).

Nothing here touches a device: the compiled step (compiled_step.py) receives what build() returns.
"""

from collections.abc import Sequence
from typing import Optional

from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxpaged.runner.batch import StepInputs, empty_step_inputs, fill_step_inputs
from jaxpaged.runner.buckets import Bucket, BucketLadder
from jaxpaged.runner.host_block_table import HostBlockTable


class StepInputBuilder:
    """Pads each step's scheduled requests into the smallest bucket that holds them."""

    def __init__(self, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, block_size: int,
                 num_kv_groups: int = 1) -> None:
        self.block_size = block_size
        """Tokens per KV block."""
        self.blocks_per_seq = -(-max_model_len // block_size)
        """Block-table columns: the blocks of one max_model_len sequence."""
        self.ladder = BucketLadder(max_num_batched_tokens, max_num_seqs)
        """The (tokens, sequences) shapes a step is padded to, one compiled executable each."""
        self.block_table = HostBlockTable(max_num_seqs, self.blocks_per_seq)
        self.num_kv_groups = num_kv_groups
        """KV layer groups (runner/kv_spec.py): a block table per request each."""
        self.group_block_tables = [HostBlockTable(max_num_seqs, self.blocks_per_seq) for _ in range(num_kv_groups - 1)]
        """The block tables of the groups after the first (the first is block_table)."""
        self.prompt_rows: list[tuple[int, str, int]] = []
        """(token row, request id, prompt position) of the last built batch's prompt-logprob targets."""
        self.feeds_previous = False
        """The last built batch has rows whose token comes from the previous step's sampled ids."""
        self._previous_rows: dict[str, int] = {}
        """Request id -> its row in the previous step's sampled ids (async scheduling)."""

    def empty(self, bucket: Bucket) -> StepInputs:
        """A batch of `bucket` holding only padding (warm-up, measurements: it writes only the null block)."""
        return empty_step_inputs(bucket.num_tokens, bucket.num_seqs, self.blocks_per_seq, self.num_kv_groups)

    def fill(self, scheduled: Sequence[ScheduledRequest]) -> tuple[Bucket, StepInputs]:
        """The scheduled requests' tokens, positions and block tables, padded into their bucket."""
        num_tokens = sum(len(item.token_ids) for item in scheduled)
        bucket = self.ladder.pick(num_tokens, len(scheduled))
        return bucket, fill_step_inputs(scheduled, bucket, self.block_table, self.block_size, self.group_block_tables)

    def build(self, output: SchedulerOutput, lora_slots: Optional[Sequence[int]] = None,
              bucket: Optional[Bucket] = None) -> tuple[Bucket, StepInputs]:
        """fill(), plus the rows fed from the previous step's sampled ids and the prompt-logprob targets (left in
        feeds_previous and prompt_rows); `lora_slots`: each scheduled request's LoRA slot (None: all base);
        `bucket`: pad into this one (ranks in lock step share the largest rank's), else the smallest that holds it."""
        scheduled = output.scheduled
        bucket = bucket or self.ladder.pick(output.num_scheduled_tokens, len(scheduled))
        batch = fill_step_inputs(scheduled, bucket, self.block_table, self.block_size, self.group_block_tables,
                                 lora_slots)
        self.prompt_rows = []
        self.feeds_previous = False
        for seq_index, item in enumerate(scheduled):
            if item.input_in_flight:  # a decode row: its one token sits at the sequence's first row
                row = int(batch.attention.cu_q_lens[seq_index])
                batch.token_sources[row] = self._previous_rows[item.request.request_id]
                self.feeds_previous = True
            if item.request.computes_whole_prompt:
                token_start = int(batch.attention.cu_q_lens[seq_index])
                self._set_prompt_logprob_targets(batch, item.request, token_start, item.start_position,
                                                 item.start_position + len(item.token_ids))
        return bucket, batch

    def remember_sampling_rows(self, sampling: Sequence[Request]) -> None:
        """The step just sampled one row per entry of `sampling`: the next build() feeds in-flight rows from them."""
        self._previous_rows = {request.request_id: row for row, request in enumerate(sampling)}

    def _set_prompt_logprob_targets(self, batch: StepInputs, request: Request, token_start: int, start: int,
                                    end: int) -> None:
        """Rows of positions start..end-1 whose next token is a prompt token target it (a request that asked for
        prompt logprobs computes its whole prompt: core/request.py computes_whole_prompt)."""
        prompt = request.prompt_token_ids
        for position in range(start, min(end, len(prompt) - 1)):
            row = token_start + position - start
            batch.prompt_logprob_targets[row] = prompt[position + 1]
            self.prompt_rows.append((row, request.request_id, position + 1))

"""fill_step_inputs against a reference that writes each request's rows one at a time (the definition of the
layout): random mixes of prefill chunks and decodes, chunk lengths 1..many blocks around the block size, and
runs of steps through one HostBlockTable whose sequences grow, finish, arrive and change rows."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest
from jaxpaged.runner.batch import StepInputs, empty_step_inputs, fill_step_inputs
from jaxpaged.runner.buckets import Bucket
from jaxpaged.runner.host_block_table import HostBlockTable

BLOCK_SIZE = 4
PAGES_PER_SEQ = 8
BUCKET = Bucket(num_tokens=64, num_seqs=8)


def reference_inputs(scheduled: list[ScheduledRequest]) -> StepInputs:
    """Row by row, as the layout is specified in batch.py and the attention metadata."""
    batch = empty_step_inputs(BUCKET.num_tokens, BUCKET.num_seqs, PAGES_PER_SEQ)
    attention, row, num_sampled = batch.attention, 0, 0
    for seq, item in enumerate(scheduled):
        for offset, token in enumerate(item.token_ids):
            position = item.start_position + offset
            batch.token_ids[row] = token
            batch.positions[row] = position
            attention.slot_mapping[row] = item.block_ids[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE
            row += 1
        for page, block in enumerate(item.block_ids):
            attention.block_tables[seq, page] = block
        attention.kv_lens[seq] = item.start_position + len(item.token_ids)
        attention.cu_q_lens[seq + 1] = row
        if item.sample:
            batch.sample_indices[num_sampled] = row - 1
            num_sampled += 1
    attention.cu_q_lens[len(scheduled) + 1:] = row
    attention.num_seqs[0] = len(scheduled)
    return batch


@st.composite
def scheduled_requests(draw) -> list[ScheduledRequest]:
    """Up to 8 sequences, at most 64 tokens in all; each one's blocks cover its tokens (plus maybe one more)."""
    scheduled, budget, next_block = [], BUCKET.num_tokens, 1
    for index in range(draw(st.integers(0, BUCKET.num_seqs))):
        num_new = draw(st.sampled_from([1, 1, 2, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 2 * BLOCK_SIZE + 3]))
        if num_new > budget:
            break
        budget -= num_new
        start = draw(st.integers(0, PAGES_PER_SEQ * BLOCK_SIZE - num_new - 1))
        num_blocks = min(PAGES_PER_SEQ, -(-(start + num_new) // BLOCK_SIZE) + draw(st.integers(0, 1)))
        blocks = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        tokens = draw(st.lists(st.integers(1, 1000), min_size=num_new, max_size=num_new))
        request = Request(f"r{index}", list(range(1, start + num_new + 1)))
        scheduled.append(ScheduledRequest(request, tokens, start, blocks, draw(st.booleans())))
    return scheduled


@settings(max_examples=60, deadline=None)
@given(scheduled=scheduled_requests())
def test_fill_step_inputs_matches_the_row_by_row_layout(scheduled):
    assert_same_inputs(fill_step_inputs(scheduled, BUCKET, HostBlockTable(8, PAGES_PER_SEQ), BLOCK_SIZE),
                       reference_inputs(scheduled))


@settings(max_examples=60, deadline=None)
@given(scheduled=scheduled_requests())
def test_a_step_counts_its_real_rows_and_its_sampled_rows(scheduled):
    # The native CPU matmul skips the rows from these counts on (models/llama.py): they must never undercount.
    batch = fill_step_inputs(scheduled, BUCKET, HostBlockTable(8, PAGES_PER_SEQ), BLOCK_SIZE)
    assert int(batch.attention.cu_q_lens[-1]) == sum(len(item.token_ids) for item in scheduled)
    num_sampled = sum(1 for item in scheduled if item.sample)
    assert int(batch.num_sampled_rows()) == max(num_sampled, 1)  # sampling nothing still counts row 0


def assert_same_inputs(got: StepInputs, want: StepInputs) -> None:
    for name in ("token_ids", "positions", "sample_indices", "prompt_logprob_targets"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        assert getattr(got, name).dtype == np.int32, name
    for name in ("slot_mapping", "kv_lens", "block_tables", "cu_q_lens", "num_seqs"):
        np.testing.assert_array_equal(getattr(got.attention, name), getattr(want.attention, name), err_msg=name)
        assert getattr(got.attention, name).dtype == np.int32, name


def test_fill_step_inputs_of_no_requests_is_all_padding():
    batch = fill_step_inputs([], BUCKET, HostBlockTable(8, PAGES_PER_SEQ), BLOCK_SIZE)
    assert not batch.token_ids.any() and not batch.attention.block_tables.any()
    assert int(batch.attention.num_seqs[0]) == 0 and not batch.attention.cu_q_lens.any()


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 9), max_size=8, unique=True),
                                st.lists(st.integers(0, 2), min_size=10, max_size=10)), min_size=1, max_size=8))
def test_a_kept_block_table_matches_a_fresh_one_step_after_step(steps):
    """Ten requests with live, growing block lists; each step schedules some of them in some order (a decode each)
    after growing each list by 0-2 blocks; a request that leaves and comes back gets a new list (preemption)."""
    kept = HostBlockTable(8, PAGES_PER_SEQ)
    lists: dict[int, list[int]] = {}
    next_block = 1
    for order, growth in steps:
        for request in list(lists):
            if request not in order:
                del lists[request]  # it left the batch: finished or preempted
        for request in order:
            block_ids = lists.setdefault(request, [])
            for _ in range(min(growth[request], PAGES_PER_SEQ - 1 - len(block_ids)) if block_ids else 1):
                block_ids.append(next_block)
                next_block += 1
        scheduled = [ScheduledRequest(Request(f"r{r}", [1] * (BLOCK_SIZE * len(lists[r]))), [r + 1],
                                      BLOCK_SIZE * len(lists[r]) - 1, lists[r], True) for r in order]
        assert_same_inputs(fill_step_inputs(scheduled, BUCKET, kept, BLOCK_SIZE), reference_inputs(scheduled))

"""Verifying proposals in the scheduler, worked by hand with 4-token blocks: what a speculative row computes, which
proposals update_from_output keeps, and that the rejected ones leave no trace (computed count, blocks, cache)."""

from jaxpaged.core import RequestStatus
from tests.core.core_helpers import build_scheduler, make_request

EOS = 2


def _decoding(scheduler, num_prompt_tokens: int = 3, first_output: int = 50, **options):
    """A request past its prefill: prompt 1000.. (num_prompt_tokens), one output token; its next step decodes."""
    request = make_request("a", num_prompt_tokens, **{"max_tokens": 20, **options})
    scheduler.add_request(request)
    prefill = scheduler.schedule()
    scheduler.update_from_output(prefill, [first_output])
    return request


def _only(output):
    (item,) = output.scheduled
    return item


def test_a_row_carries_the_newest_token_and_its_proposals_and_samples_at_each():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    request = _decoding(scheduler)  # tokens 1000 1001 1002 50; position 3 (token 50) is next
    request.spec_token_ids = [60, 61, 62]
    output = scheduler.schedule()
    item = _only(output)
    assert (item.token_ids, item.start_position, item.num_spec_tokens, item.sample) == ([50, 60, 61, 62], 3, 3, True)
    assert output.num_scheduled_tokens == 4 and output.num_sampled_rows == 4
    assert request.num_computed_tokens == 7  # tentatively: positions 3..6
    assert len(scheduler.kv_cache_manager.get_block_ids("a")) == 2  # room for position 4..6 too


def test_every_proposal_accepted_appends_them_and_the_draw_after():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    request = _decoding(scheduler)
    request.spec_token_ids = [60, 61, 62]
    output = scheduler.schedule()
    updated = scheduler.update_from_output(output, [60, 61, 62, 63])
    assert updated == [request] and request.num_step_tokens == 4
    assert request.output_token_ids == [50, 60, 61, 62, 63]
    assert request.num_computed_tokens == 7  # K/V of 1000..62; 63 is computed by the next step
    assert request.spec_token_ids == []
    # Block 0 (positions 0..3) is full and cached; block 1 holds computed positions 4..6 only.
    assert len(request.block_hashes) == 1
    stats = scheduler.spec_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 3)
    assert stats.accepted_per_position == [1, 1, 1]


def test_a_rejected_proposal_rolls_back_its_slots_and_frees_the_block_allocated_for_them():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    kv = scheduler.kv_cache_manager
    request = _decoding(scheduler)
    free_before = kv.num_free_blocks
    request.spec_token_ids = [60, 61, 62]
    output = scheduler.schedule()
    assert kv.num_free_blocks == free_before - 1
    scheduler.update_from_output(output, [77, 61, 62, 63])  # the first draw differs: nothing accepted
    assert request.output_token_ids == [50, 77] and request.num_step_tokens == 1
    assert request.num_computed_tokens == 4  # positions 0..3; 77 at position 4 is next
    assert kv.num_free_blocks == free_before  # block 1 held only rejected proposals
    assert len(kv.get_block_ids("a")) == 1
    # The next step decodes 77 at position 4 in a new block, as without speculation.
    item = _only(scheduler.schedule())
    assert (item.token_ids, item.start_position, item.num_spec_tokens) == ([77], 4, 0)
    assert len(kv.get_block_ids("a")) == 2


def test_a_partly_accepted_row_keeps_the_prefix_that_matches():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    request = _decoding(scheduler)
    request.spec_token_ids = [60, 61, 62]
    scheduler.update_from_output(scheduler.schedule(), [60, 99, 62, 63])
    assert request.output_token_ids == [50, 60, 99]
    assert request.num_computed_tokens == 5
    assert scheduler.spec_stats.accepted_per_position == [1, 0, 0]


def test_eos_among_accepted_proposals_finishes_there():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    request = _decoding(scheduler, eos_token_id=EOS)
    request.spec_token_ids = [60, EOS, 62]
    scheduler.update_from_output(scheduler.schedule(), [60, EOS, 62, 63])
    assert request.status is RequestStatus.FINISHED_STOPPED
    assert request.output_token_ids == [50, 60, EOS]
    assert scheduler.kv_cache_manager.usage == 0.0


def test_proposals_are_capped_by_the_budget_max_tokens_and_max_model_len():
    scheduler = build_scheduler(max_num_batched_tokens=16, max_num_seqs=8, max_spec_tokens_per_step=32)
    request = _decoding(scheduler, max_tokens=3)  # 1 output so far: at most 2 more, so 1 proposal is verifiable
    request.spec_token_ids = [60, 61, 62]
    assert _only(scheduler.schedule()).token_ids == [50, 60]

    scheduler = build_scheduler(max_model_len=6, max_spec_tokens_per_step=32)
    request = _decoding(scheduler, max_tokens=3)  # 4 tokens; max_model_len 6: one more after the next draw
    request.spec_token_ids = [60, 61, 62]
    assert _only(scheduler.schedule()).token_ids == [50, 60]

    scheduler = build_scheduler(max_num_batched_tokens=8, max_num_seqs=8, max_spec_tokens_per_step=32)
    first = _decoding(scheduler)
    other = make_request("b", 6, first_token=2000)
    first.spec_token_ids = list(range(60, 70))
    scheduler.add_request(other)
    output = scheduler.schedule()
    # The running decode goes first: its proposals take the rest of the budget, and the admission waits.
    assert [len(item.token_ids) for item in output.scheduled] == [8]
    assert output.num_scheduled_tokens == 8


def test_a_step_verifies_no_more_proposals_than_its_sampling_rows_hold():
    scheduler = build_scheduler(max_spec_tokens_per_step=5)
    requests = [make_request(name, 3, first_token=1000 + 10 * i, max_tokens=20) for i, name in enumerate("abc")]
    for request in requests:
        scheduler.add_request(request)
    scheduler.update_from_output(scheduler.schedule(), [50, 51, 52])
    for request in requests:
        request.spec_token_ids = [60, 61, 62]
    output = scheduler.schedule()
    # In admission order: 3 proposals, then the 2 left of the step's 5, then none.
    assert [item.num_spec_tokens for item in output.scheduled] == [3, 2, 0]
    assert output.num_sampled_rows == 3 + 5


def test_a_prefill_chunk_never_carries_proposals():
    scheduler = build_scheduler(max_spec_tokens_per_step=32)
    request = make_request("a", 10, max_tokens=5)
    request.spec_token_ids = [1, 2]
    scheduler.add_request(request)
    item = _only(scheduler.schedule())
    assert (len(item.token_ids), item.num_spec_tokens) == (10, 0)


def test_sequences_and_proposals_share_the_steps_max_num_seqs_sampling_rows():
    # max_num_seqs 4: two decodes leave two rows for proposals; the waiting request is admitted only when the step
    # verifies fewer proposals than the rows left.
    scheduler = build_scheduler(max_num_seqs=4, max_spec_tokens_per_step=32)
    first, second = (make_request(name, 3, first_token=1000 + 10 * i, max_tokens=20) for i, name in enumerate("ab"))
    for request in (first, second):
        scheduler.add_request(request)
    scheduler.update_from_output(scheduler.schedule(), [50, 51])
    third = make_request("c", 3, first_token=3000)
    scheduler.add_request(third)
    first.spec_token_ids, second.spec_token_ids = [60, 61, 62], [70, 71, 72]
    output = scheduler.schedule()
    assert [item.num_spec_tokens for item in output.scheduled] == [2, 0]  # 2 sequences + 2 proposals = 4 rows
    assert output.num_sampled_rows == 4 and third.status is RequestStatus.WAITING
    scheduler.update_from_output(output, [60, 61, 99, 72])  # first keeps 60, 61 (and 99); second draws 72

    first.spec_token_ids, second.spec_token_ids = [80], []  # the speculator sets every request's anew
    output = scheduler.schedule()  # 2 sequences + 1 proposal: one row left for the admission
    assert [item.request.request_id for item in output.scheduled] == ["a", "b", "c"]
    assert output.num_sampled_rows == 4

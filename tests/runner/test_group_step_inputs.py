"""KV layer groups in the step inputs (runner/batch.py GroupTables): each group's block tables and K/V slots, group 0
also in the attention metadata; one group adds nothing to the packed inputs; a request without a table per group is
refused by name."""

import numpy as np
import pytest

from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest
from jaxpaged.runner.batch import empty_step_inputs, fill_step_inputs, pack_step_inputs
from jaxpaged.runner.buckets import Bucket
from jaxpaged.runner.host_block_table import HostBlockTable

BUCKET = Bucket(num_tokens=16, num_seqs=4)


def test_each_group_gets_its_tables_and_slots():
    """A 3-token chunk at position 9 (4-token blocks) writes slots in block 2 of each group's table: 7*4+1.. in
    group 0, 9*4+1.. in group 1, whose table is null before the window; a decode at position 4 writes block 1."""
    chunk = ScheduledRequest(Request("a", list(range(12))), [9, 10, 11], 9, [5, 6, 7],
                             True, group_block_ids=([5, 6, 7], [0, 8, 9]))
    decode = ScheduledRequest(Request("b", list(range(5))), [4], 4, [3, 4], True, group_block_ids=([3, 4], [2, 1]))
    tables = [HostBlockTable(4, 8), HostBlockTable(4, 8)]
    batch = fill_step_inputs([chunk, decode], BUCKET, tables[0], 4, tables[1:])
    groups = batch.group_tables
    assert groups is not None
    assert groups.slot_mapping[0, :4].tolist() == [29, 30, 31, 16] == batch.attention.slot_mapping[:4].tolist()
    assert groups.slot_mapping[1, :4].tolist() == [37, 38, 39, 4]
    assert groups.block_tables[1, 0, :3].tolist() == [0, 8, 9] and groups.block_tables[1, 1, :2].tolist() == [2, 1]
    np.testing.assert_array_equal(groups.block_tables[0], batch.attention.block_tables)


def test_one_group_sends_what_it_sent_before():
    """Without groups the packed step inputs are the same size as ever (no group tables)."""
    one = pack_step_inputs(empty_step_inputs(16, 4, 8))
    two = pack_step_inputs(empty_step_inputs(16, 4, 8, num_groups=2))
    assert empty_step_inputs(16, 4, 8).group_tables is None
    assert two.size == one.size + 2 * (4 * 8 + 16)


def test_a_request_without_group_tables_is_refused_by_name():
    """Hand-built schedules for a grouped pool must give each group's table."""
    item = ScheduledRequest(Request("a", [1, 2]), [1, 2], 0, [1], True)
    with pytest.raises(ValueError, match="group_block_ids"):
        fill_step_inputs([item], BUCKET, HostBlockTable(4, 8), 4, [HostBlockTable(4, 8)])

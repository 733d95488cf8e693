"""Multi-host start-up compares every process's runner shapes (runner/process_agreement.py): processes started
with different flags fail naming the setting that differs, before any step's collective could hang on them."""

import numpy as np
import pytest

from jaxpaged.runner.process_agreement import check_same_runners, runner_signature
from jaxpaged.runner.step_inputs import StepInputBuilder

POOL = (1, 2048, 4, 2, 16)


def builder(max_model_len: int = 256, num_kv_groups: int = 3, max_num_batched_tokens: int = 32) -> StepInputBuilder:
    return StepInputBuilder(max_num_batched_tokens, 4, max_model_len, 4, num_kv_groups)


def test_processes_with_the_same_flags_agree():
    """Two builders of the same settings sign alike, and a job of such processes passes the check."""
    own = runner_signature(builder(), POOL)
    assert np.array_equal(own, runner_signature(builder(), POOL))
    check_same_runners(own, np.stack([own, own]))


@pytest.mark.parametrize(("other", "other_pool", "named"), [
    (dict(num_kv_groups=1), (3, 682, 4, 2, 16), "KV cache groups"),  # --disable-hybrid-kv-cache-manager on one host
    (dict(max_model_len=128), POOL, "block-table columns"),
    (dict(max_num_batched_tokens=64), POOL, "step buckets"),
    ({}, (1, 1024, 4, 2, 16), "KV pool shape"),
])
def test_a_process_with_other_flags_is_named_with_the_setting(other, other_pool, named):
    """The first differing setting is named, with the process that differs and both values."""
    own = runner_signature(builder(), POOL)
    theirs = runner_signature(builder(**other), other_pool)
    with pytest.raises(ValueError, match=f"^multi-host: process 1 built a runner of other shapes .*: {named}"):
        check_same_runners(own, np.stack([own, theirs]))


"""max_model_len left unset: the model's context length, lowered (with a logged reason) to what the pool holds."""

import logging

import pytest

from jaxpaged.config import EngineConfig, SchedulerConfig
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.runner.memory_plan import fit_max_model_len


def test_the_context_length_is_kept_when_the_pool_holds_it(caplog):
    with caplog.at_level(logging.INFO, logger="jaxpaged"):
        assert fit_max_model_len(1024, num_kv_blocks=65, block_size=16) == 1024
    assert "lowered" not in caplog.text


def test_a_pool_too_small_lowers_it_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="jaxpaged"):
        assert fit_max_model_len(8192, num_kv_blocks=48, block_size=16) == 47 * 16
    assert "max_model_len: 8192 (the model's context length) lowered to 752" in caplog.text


def test_unset_is_the_default_and_a_scheduler_needs_it_resolved():
    assert EngineConfig().scheduler.max_model_len is None
    with pytest.raises(ValueError, match="^max_model_len: "):
        SchedulerConfig(max_model_len=0)
    with pytest.raises(ValueError, match="^max_model_len: the scheduler needs a number"):
        Scheduler(SchedulerConfig(), EngineConfig().cache, 16)

"""Persisting the KV cache at shutdown under a deadline: what does not fit in the time is left out and logged (how
many blocks were and were not written), never cut off unseen; without a deadline everything is written."""

import logging
import time

import pytest

from tests.prefix_prompts import ask, token_ids

pytestmark = pytest.mark.xdist_group("kv_tiers")

OPTIONS = dict(max_model_len=256, max_num_seqs=2, max_num_batched_tokens=128, num_kv_blocks=40, block_size=16,
               dtype="float32", attention_backend="xla", compilation_cache_dir="")


def test_persist_stops_at_the_deadline_and_says_what_it_left_out(tiny_model_dir, tmp_path, caplog):
    from jaxpaged.llm import LLM

    llm = LLM(str(tiny_model_dir), **OPTIONS, kv_offload_dir=str(tmp_path))
    ask(llm, token_ids(7, 100))  # 6 full blocks cached on the device
    with caplog.at_level(logging.INFO, logger="jaxpaged.features.kv_tiers"):
        llm.engine.close(deadline=time.monotonic())  # no time at all
    assert not list(tmp_path.rglob("*.kv"))
    (cut,) = [record for record in caplog.records if "persisted" in record.getMessage()]
    assert cut.levelno == logging.WARNING
    assert "0 blocks persisted" in cut.getMessage() and "6 cached blocks NOT persisted" in cut.getMessage()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxpaged.features.kv_tiers"):
        llm.engine.close()
    assert len(list(tmp_path.rglob("*.kv"))) == 6
    (done,) = [record for record in caplog.records if "persisted" in record.getMessage()]
    assert done.levelno == logging.INFO and "6 blocks persisted" in done.getMessage()

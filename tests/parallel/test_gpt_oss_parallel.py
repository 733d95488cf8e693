"""gpt-oss under tensor parallelism on forced CPU devices: with whole experts per device (expert parallelism) and
with every expert's width split, the greedy tokens equal one device's (attention sinks split by q head, expert and
o_proj biases added once)."""

import json

import pytest

from tests.json_worker import run_json_worker
from tests.models.moe_checkpoints import random_prompts
from tests.models.test_gpt_oss import PROMPTS, make_gpt_oss
from tests.parallel.test_expert_parallel import WORKER_TIMEOUT_S


@pytest.mark.slow  # three engines in one subprocess
def test_gpt_oss_at_tp2_with_and_without_expert_parallelism(tmp_path, smollm2_tokenizer_dir):
    """tp 2 with 2 of the 4 experts per device, and tp 2 with each expert's width halved: one device's tokens."""
    fused, mxfp4 = tmp_path / "fused", tmp_path / "mxfp4"
    fused.mkdir()
    mxfp4.mkdir()
    make_gpt_oss(fused, mxfp4, smollm2_tokenizer_dir)
    layouts = [(2, True), (2, False)]
    results = run_json_worker("tests.parallel.moe_worker", [str(mxfp4), json.dumps(layouts),
                                                            json.dumps(random_prompts(*PROMPTS)), "{}"],
                              2, WORKER_TIMEOUT_S)
    for result in results:
        assert result["identical"], result
    assert [r["expert_shard"] for r in results] == [[2, 64, 32], [4, 64, 16]]

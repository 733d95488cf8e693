"""LoRA slots under tensor parallelism (2 forced CPU devices, in a subprocess): split as their projections, and the
tp = 2 engine's tokens are tp = 1's for base rows and two adapters' rows in one batch."""

import pytest

from tests.conftest import TINY_LLAMA, save_tiny_llama
from tests.json_worker import run_json_worker
from tests.lora.peft_files import write_peft_adapter

WORKER_TIMEOUT_S = 480
ONE_KV_HEAD = TINY_LLAMA | dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=1)


@pytest.mark.slow  # two engines compiled in a subprocess: minutes on a loaded 2-core machine
def test_lora_at_tp2_matches_tp1_with_slots_split_as_their_projections(tmp_path, smollm2_tokenizer_dir):
    """Column-parallel q's B splits its out axis, row-parallel o's A its in axis (their partners stay whole), k's B
    holds the repeated KV head; greedy tokens equal tp = 1's, and serving compiles nothing."""
    model_dir = save_tiny_llama(tmp_path / "model", smollm2_tokenizer_dir, ONE_KV_HEAD)
    dirs = []
    for index, targets in enumerate((["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj",
                                                                                 "k_proj"])):
        write_peft_adapter(tmp_path / f"adapter{index}", ONE_KV_HEAD, rank=4 + 4 * index, alpha=8.0,
                           targets=targets, seed=index)
        dirs.append(str(tmp_path / f"adapter{index}"))
    result = run_json_worker("tests.lora.tp_worker", [str(model_dir), *dirs], 2, WORKER_TIMEOUT_S)
    assert result["got"] == result["expected"]
    assert len({tuple(tokens) for tokens in result["expected"]}) > 2  # the adapters changed the tokens
    # per layer [slots, rank, in] / [slots, out, rank]; 3 slots, rank 8, hidden 128, q 128, kv 16 repeated to 32
    assert result["split"] == {"lora_a.q_proj": [[3, 8, 128]] * 2, "lora_b.q_proj": [[3, 64, 8]] * 2,
                               "lora_a.o_proj": [[3, 8, 64]] * 2, "lora_b.o_proj": [[3, 128, 8]] * 2,
                               "lora_b.k_proj": [[3, 16, 8]] * 2}
    assert result["compilations_while_serving"] == 0

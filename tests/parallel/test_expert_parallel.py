"""Expert parallelism (and MoE experts split by width under plain tensor parallelism) on forced CPU devices give one
device's greedy tokens, including a batch whose every token routes to the same expert.

Each case runs moe_worker.py in a subprocess with JAX_NUM_CPU_DEVICES=4 and its own timeout. The tiny Qwen3-MoE has
8 experts (2 per device at tp 4) of width 16, 4 q heads and 4 kv heads.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.json_worker import run_json_worker
from tests.models.test_qwen3_moe import PROMPTS, make_qwen3_moe

WORKER_TIMEOUT_S = 300


def run_layouts(model_dir, layouts: list[tuple[int, bool]], options=None) -> list[dict]:
    return run_json_worker("tests.parallel.moe_worker", [str(model_dir), json.dumps(layouts), json.dumps(PROMPTS),
                                                         json.dumps(options or {})], 4, WORKER_TIMEOUT_S)


@pytest.mark.slow  # five engines in one subprocess: about two minutes on 2 cores
def test_expert_parallel_at_tp2_and_tp4_and_width_split_at_tp2(tmp_path, smollm2_tokenizer_dir):
    """tp 2 and 4 with whole experts per device (8 / tp each), and tp 2 with every expert's width split: one
    device's greedy tokens, the experts really split as said."""
    make_qwen3_moe(tmp_path, smollm2_tokenizer_dir, num_hidden_layers=2, num_key_value_heads=4, norm_topk_prob=True)
    results = run_layouts(tmp_path, [(2, True), (4, True), (2, False)])
    for result in results:
        assert result["identical"], result
    assert [r["expert_shard"] for r in results] == [[4, 64, 16], [2, 64, 16], [8, 64, 8]]


def test_expert_parallel_with_every_token_on_one_expert(tmp_path, smollm2_tokenizer_dir):
    """Zero router weights and top-1 routing send every token to expert 0 (JAX breaks the tie towards the lowest
    id): at tp 4 one device computes every assignment and three compute none; the tokens equal one device's."""
    make_qwen3_moe(tmp_path, smollm2_tokenizer_dir, num_hidden_layers=2, num_key_value_heads=4,
                   norm_topk_prob=False, num_experts_per_tok=1)
    [file] = tmp_path.glob("*.safetensors")
    tensors = load_file(file)
    for name in tensors:
        if name.endswith("mlp.gate.weight"):
            tensors[name] = np.zeros_like(tensors[name])  # equal logits: JAX's top-1 is expert 0 for every token
    save_file(tensors, str(file), metadata={"format": "pt"})
    [result] = run_layouts(tmp_path, [(4, True)])
    assert result["identical"], result
    assert result["expert_shard"] == [2, 64, 16]

"""Expert parallelism over dp x tp devices: the data-parallel ranks step in lock step as one program
(runner/lock_step.py) and give one device's greedy tokens, with an idle rank, and with every token on one expert.

The end-to-end cases run in ONE worker process (moe_lock_step_worker.py, JAX_NUM_CPU_DEVICES=4, its own timeout):
the tiny Qwen3-MoE of test_expert_parallel.py (8 experts of width 16, 4 q and 4 kv heads) at dp 2 x tp 2 (2 experts
per device) and dp 2 x tp 1 (4 per device), the same model with a zero router and top-1 routing at dp 2 x tp 2, and
the tiny gpt-oss of test_gpt_oss_parallel.py at dp 2 x tp 2.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxpaged.config import EngineConfig
from jaxpaged.models.moe_decoder import MoeModelConfig, moe_fields, with_expert_parallel
from jaxpaged.models.registry import read_model_config
from jaxpaged.runner.batch import PackedLayout, empty_step_inputs, pack_step_inputs, unpack_step_inputs
from jaxpaged.runner.lock_step import check_lock_step_options
from jaxpaged.runner.lock_step_step import join_ranks, shift_prompt_rows
from jaxpaged.runner.memory_plan import weight_bytes_per_device
from tests.conftest import TINY_LLAMA
from tests.json_worker import run_json_worker
from tests.models.moe_checkpoints import random_prompts
from tests.models.test_gpt_oss import PROMPTS as GPT_OSS_PROMPTS
from tests.models.test_gpt_oss import make_gpt_oss
from tests.models.test_qwen3_moe import PROMPTS, make_qwen3_moe

WORKER_TIMEOUT_S = 480


@pytest.fixture(scope="module")
def lock_step_results(tmp_path_factory, smollm2_tokenizer_dir) -> dict[str, list[dict]]:
    """The worker's results: "routed" (dp 2 x tp 2, dp 2 x tp 1), "one_expert" and "gpt_oss" (dp 2 x tp 2)."""
    routed = tmp_path_factory.mktemp("moe-routed")
    make_qwen3_moe(routed, smollm2_tokenizer_dir, num_hidden_layers=2, num_key_value_heads=4, norm_topk_prob=True)
    one_expert = tmp_path_factory.mktemp("moe-one-expert")
    make_qwen3_moe(one_expert, smollm2_tokenizer_dir, num_hidden_layers=2, num_key_value_heads=4,
                   norm_topk_prob=False, num_experts_per_tok=1)
    [file] = one_expert.glob("*.safetensors")
    tensors = load_file(file)
    for name in tensors:
        if name.endswith("mlp.gate.weight"):
            tensors[name] = np.zeros_like(tensors[name])  # equal logits: JAX's top-1 is expert 0 for every token
    save_file(tensors, str(file), metadata={"format": "pt"})
    gpt_oss = tmp_path_factory.mktemp("gpt-oss")
    make_gpt_oss(tmp_path_factory.mktemp("gpt-oss-fused"), gpt_oss, smollm2_tokenizer_dir)
    jobs = [[str(routed), [[2, 2], [2, 1]], PROMPTS, {}],  # async scheduling on (its default)
            [str(one_expert), [[2, 2]], PROMPTS, {"async_scheduling": False}],
            [str(gpt_oss), [[2, 2]], random_prompts(*GPT_OSS_PROMPTS), {}]]
    results = run_json_worker("tests.parallel.moe_lock_step_worker", [json.dumps(jobs)], 4, WORKER_TIMEOUT_S)
    return {"routed": results[0], "one_expert": results[1], "gpt_oss": results[2]}


@pytest.mark.slow  # one worker process, four engines: about 2.5 minutes on 2 busy cores
def test_dp2_tp2_and_dp2_tp1_give_one_devices_tokens_with_both_ranks_busy_and_one_idle(lock_step_results):
    """Three prompts over two ranks (both run), then one prompt alone (the other rank steps on padding), with async
    scheduling (rows in flight fed from their own rank's sampled ids): every greedy token equals one device's, the
    experts split E / (dp x tp) per device."""
    for result in lock_step_results["routed"]:
        assert result["identical"] and result["async_scheduling"], result
        assert set(result["routed"][:3]) == {0, 1}, result["routed"]
        assert result["steps_with_idle_rank"] > 0
    assert [r["expert_shard"] for r in lock_step_results["routed"]] == [[2, 64, 16], [4, 64, 16]]


@pytest.mark.slow  # shares the worker above
def test_every_token_on_one_expert_at_dp2_tp2(lock_step_results):
    """A zero router with top-1 sends every token of both ranks to expert 0, which one device of rank 0 holds: the
    other three compute nothing and the tokens still equal one device's (synchronous steps)."""
    [result] = lock_step_results["one_expert"]
    assert result["identical"] and not result["async_scheduling"], result
    assert result["expert_shard"] == [2, 64, 16]


@pytest.mark.slow  # shares the worker above
def test_gpt_oss_with_kv_groups_sinks_and_biases_at_dp2_tp2(lock_step_results):
    """gpt-oss (sliding and full layers in KV cache groups, attention sinks, expert biases, MXFP4 experts; prompts
    several windows long): one device's tokens with 1 of its 4 experts per device."""
    [result] = lock_step_results["gpt_oss"]
    assert result["identical"], result
    assert result["expert_shard"] == [1, 64, 32]


@pytest.mark.slow  # shares the worker above
def test_start_up_plan_names_the_placement_over_dp_x_tp(lock_step_results):
    """The plan says the ranks run in lock step and where the experts live: "experts over dp x tp = 4 devices, E/4
    each" (2 ranks x 1 device: E/2)."""
    at_tp2, at_tp1 = lock_step_results["routed"]
    assert "experts over dp x tp = 4 devices, E/4 each (2 whole experts)" in at_tp2["plan_experts"]
    assert "experts over dp x tp = 2 devices, E/2 each (4 whole experts)" in at_tp1["plan_experts"]
    assert "(cpu, tp=2, dp=2 in lock step)" in at_tp2["plan"]


def _moe_config(**overrides) -> MoeModelConfig:
    dense = read_model_config(dict(TINY_LLAMA, architectures=["LlamaForCausalLM"]))
    return MoeModelConfig(**moe_fields(dense), num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                          **overrides)


def test_memory_plan_counts_experts_split_over_dp_x_tp():
    """An expert stack's bytes per device are 1 / (dp x tp) of it under experts over ranks, 1 / tp over tp alone, and
    a replicated norm is counted whole either way."""
    params = {"layers.expert_gate": np.zeros((2, 8, 64, 16), np.float32),
              "layers.input_norm": np.zeros((2, 64), np.float32)}
    whole_experts, norm = 2 * 8 * 64 * 16 * 4, 2 * 64 * 4
    over_ranks = with_expert_parallel(_moe_config(), True, data_parallel_size=2)
    assert weight_bytes_per_device(params, over_ranks, 2, np.float32) == whole_experts // 4 + norm
    over_tp = with_expert_parallel(_moe_config(), True)
    assert weight_bytes_per_device(params, over_tp, 2, np.float32) == whole_experts // 2 + norm


def test_lock_step_refuses_what_it_does_not_run_by_name():
    """Ranks in lock step refuse LoRA, speculative decoding and the KV tiers, each error naming its option; async
    scheduling stands."""
    base = dict(data_parallel_size=2, tensor_parallel_size=2, enable_expert_parallel=True)
    for option, settings in (("enable_lora", dict(enable_lora=True)),
                             ("speculative_method", dict(speculative_method="ngram")),
                             ("kv_offload", dict(kv_offload_memory=2**20))):
        with pytest.raises(ValueError, match=f"{option}: not supported with enable_expert_parallel over "
                                             r"data_parallel_size \(2\)"):
            check_lock_step_options(EngineConfig.from_options(**base, **settings))
    check_lock_step_options(EngineConfig.from_options(**base, async_scheduling=True))


def test_engine_checks_the_layout_before_stepping_ranks_together(tmp_path, smollm2_tokenizer_dir):
    """An engine with experts over dp x tp devices checks the layout first: dp 2 on this process's one device is
    refused naming the option, before any weight is placed."""
    from jaxpaged.engine.llm_engine import LLMEngine
    from jaxpaged.weights.loader import load_model

    make_qwen3_moe(tmp_path, smollm2_tokenizer_dir, num_hidden_layers=1, num_key_value_heads=4)
    config = EngineConfig.from_options(data_parallel_size=2, enable_expert_parallel=True, dtype="float32")
    with pytest.raises(ValueError, match=r"tensor_parallel_size: tensor_parallel_size \(1\) x data_parallel_size "
                                         r"\(2\) = 2 devices are needed, but only 1 exist"):
        LLMEngine(load_model(str(tmp_path)), config, warmup=False)


def test_join_ranks_lays_each_ranks_rows_after_the_ranks_before():
    """Two ranks' batches of 16 tokens / 4 sequences joined: rank 1's tokens at rows 16.., its sampled rows shifted
    by 16, its metadata rows after rank 0's and still in its own block ids; prompt rows shift alike."""
    ranks = [empty_step_inputs(16, 4, 3), empty_step_inputs(16, 4, 3)]
    for rank, batch in enumerate(ranks):
        batch.token_ids[:3] = [10 * rank + 1, 10 * rank + 2, 10 * rank + 3]
        batch.sample_indices[:2] = [1, 2]
        batch.attention.block_tables[0] = [rank + 1, 0, 0]
        batch.attention.cu_q_lens[1:] = 3
        batch.attention.num_seqs[0] = 1 + rank
        batch.token_sources[:2] = [0, 3]  # rows in flight: their token is the previous step's sampled row 0 / 3
    layout = PackedLayout.of(ranks[0])
    packed = jnp.asarray(np.stack([pack_step_inputs(batch) for batch in ranks]))
    stacked = jax.vmap(functools.partial(unpack_step_inputs, layout=layout))(packed)  # as the compiled step cuts it
    joined = join_ranks(stacked, previous_rows=4)
    assert np.asarray(joined.token_ids)[[0, 1, 2, 16, 17, 18]].tolist() == [1, 2, 3, 11, 12, 13]
    assert np.asarray(joined.sample_indices).tolist() == [1, 2, 0, 0, 17, 18, 16, 16]
    assert np.asarray(joined.attention.block_tables)[[0, 4], 0].tolist() == [1, 2]
    assert np.asarray(joined.attention.cu_q_lens).tolist() == [0, 3, 3, 3, 3] * 2
    assert np.asarray(joined.attention.num_seqs).tolist() == [1, 2]
    assert np.asarray(joined.token_sources)[[0, 1, 16, 17]].tolist() == [0, 3, 4, 7]  # rank 1's at rows 4..
    assert shift_prompt_rows([(2, "a", 5)], 1, 16) == [(18, "a", 5)]

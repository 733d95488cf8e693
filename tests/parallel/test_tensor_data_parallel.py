"""Tensor and data parallel on forced CPU devices give the single-device engine's logits and tokens.

The device count must be set before JAX starts, so the cases run parallel_worker.py in a subprocess with
JAX_NUM_CPU_DEVICES=4 and its own timeout: every case of every model below in one process (one JAX start, not one per
model). Models: tiny random Llamas with (q heads, kv heads) = (8, 2) at tp 2 and tp 4 (each kv head replicated twice),
(4, 4) at dp 2 x tp 2, a tiny Gemma 2 at tp 2, and the embedded SmolLM2-135M (9, 3) at tp 3.
"""

import json

import pytest

from tests.conftest import TINY_LLAMA, save_tiny_llama
from tests.json_worker import run_json_worker

WORKER_TIMEOUT_S = 240
"""Per case (one reference engine and its layouts); the worker gets this much for each case it runs."""

GQA_LLAMA = TINY_LLAMA | dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2)
MHA_LLAMA = TINY_LLAMA | dict(num_attention_heads=4, num_key_value_heads=4)
GEMMA2 = {k: v for k, v in TINY_LLAMA.items() if k != "tie_word_embeddings"} | dict(
    num_attention_heads=4, num_key_value_heads=2, sliding_window=8, query_pre_attn_scalar=16,
    attn_logit_softcapping=3.0, final_logit_softcapping=5.0)
# The cases on the GQA model, by test.
GQA_CASES = {
    "float": ([(1, 2), (1, 4)], {}),
    # XLA's int8 path at every layout: at tp = 1 the start-up probe may pick a native path (the bf16 panels round the
    # inputs to bfloat16), which tp > 1 never runs; the case is about how the scales shard, not which kernel wins.
    "int8_weights": ([(1, 2), (1, 4)], {"quantization": "int8", "cpu_matmul": "xla"}),
    "int8_kv": ([(1, 2)], {"kv_cache_dtype": "int8"}),
    "w8a8": ([(1, 2)], {"quantization": "w8a8"}),
}
# The last layout also plans each step ahead on both ranks (async scheduling): the same tokens.
MHA_CASE = ([(2, 1, False), (2, 2, False), (2, 2, True)], {})
# Its reference step hand-builds one block table: one KV cache group (groups: test_kv_cache_groups_at_tp2).
GEMMA2_CASE = ([(1, 2)], {"disable_hybrid_kv_cache_manager": True})
SMOLLM2_CASE = ([(1, 3)], {})


def run_models(jobs: list[tuple[str, list]]) -> list[list]:
    """Every case of every (model, cases) job in one worker process (one JAX start), per model in order."""
    args = [arg for model, cases in jobs for arg in (model, json.dumps(cases))]
    num_cases = sum(len(cases) for _, cases in jobs)
    return run_json_worker("tests.parallel.parallel_worker", args, 4, WORKER_TIMEOUT_S * num_cases)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smollm2_tokenizer_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("parallel-models")
    gemma2 = save_tiny_llama(root / "gemma2", smollm2_tokenizer_dir, GEMMA2, config_class="Gemma2Config")
    return dict(gqa=str(save_tiny_llama(root / "gqa", smollm2_tokenizer_dir, GQA_LLAMA)),
                mha=str(save_tiny_llama(root / "mha", smollm2_tokenizer_dir, MHA_LLAMA)), gemma2=str(gemma2))


# Two worker processes, one per fixture: one process for every case took 90 s on a quiet 2-core Zen 4, over the
# suite's 60 s line for the first test's set-up.
@pytest.fixture(scope="module")
def gqa_results(model_dirs) -> dict[str, list[dict]]:
    """The GQA model's per-layout results, by GQA_CASES' names."""
    (results,) = run_models([(model_dirs["gqa"], list(GQA_CASES.values()))])
    return dict(zip(GQA_CASES, results))


@pytest.fixture(scope="module")
def other_results(model_dirs) -> dict[str, list[dict]]:
    """The MHA, Gemma 2 and embedded models' per-layout results ("mha", "gemma2", "smollm2")."""
    (mha,), (gemma2,), (smollm2,) = run_models(
        [(model_dirs["mha"], [MHA_CASE]), (model_dirs["gemma2"], [GEMMA2_CASE]), ("default", [SMOLLM2_CASE])])
    return dict(mha=mha, gemma2=gemma2, smollm2=smollm2)


def assert_matches_single_device(results: list[dict]) -> None:
    for result in results:
        layout = f"dp={result['dp']} tp={result['tp']}"
        assert result["logits_rel_error"] < 1e-4, layout
        assert result["greedy_identical"], layout
        assert result["kv_shards"] == result["tp"], layout  # the KV cache really is split over the model axis
        assert result["preemptions"] > 0, layout  # the small pool forced recompute preemption
        assert result["compilations_while_serving"] == 0, layout
        assert result["reset"] and result["hits_after_reset"] == 0, layout


def test_gqa_model_at_tp2_and_tp4_with_kv_head_replication(gqa_results):
    assert_matches_single_device(gqa_results["float"])


def test_int8_weights_at_tp2_and_tp4_shard_their_scales_with_the_output_axis(gqa_results):
    """int8 projections split as their floats; the scales of q/k/v/gate/up split with them, o/down's stay whole, and
    at tp 4 the k/v scales are replicated with their kv heads: the int8 engine at tp = 1's logits and tokens."""
    assert_matches_single_device(gqa_results["int8_weights"])


def test_int8_kv_cache_at_tp2_splits_codes_and_scales_with_their_kv_heads(gqa_results):
    """The quantized layout's rows (codes, then their scale) split on the kv-head axis like float rows: the int8-KV
    engine at tp = 1's logits and tokens."""
    assert_matches_single_device(gqa_results["int8_kv"])


def test_w8a8_at_tp2_quantizes_each_row_over_its_whole_width(gqa_results):
    """w8a8 under tensor parallelism: a row-parallel projection's input is split over the model axis, yet its
    per-token scale is the whole row's maximum and the int32 partial sums add exactly: tp = 1's logits and tokens."""
    assert_matches_single_device(gqa_results["w8a8"])


def test_data_parallel_routes_shared_prefixes_to_one_rank(other_results):
    dp2, dp2_tp2, dp2_tp2_ahead = other_results["mha"]
    assert_matches_single_device([dp2_tp2, dp2_tp2_ahead])
    for result in (dp2, dp2_tp2, dp2_tp2_ahead):
        assert result["logits_rel_error"] == 0.0 or result["tp"] > 1
        assert result["greedy_identical"]
        # Three prompts share a 20-token prefix: they all run on one rank, so only that rank reports hits.
        assert sorted(hits > 0 for hits in result["hits_per_rank"]) == [False, True], result["hits_per_rank"]


def test_gemma2_alternating_windows_and_soft_caps_at_tp2(other_results):
    """Gemma 2's per-layer window choice (a cond in the scanned body) and soft-capping, per shard."""
    assert_matches_single_device(other_results["gemma2"])


@pytest.mark.slow  # two engines in a subprocess: over a minute on two shared cores
def test_kv_cache_groups_at_tp2(tmp_path, smollm2_tokenizer_dir):
    """Gemma 2's two KV cache groups split over two devices by KV heads: the very tokens and log-probabilities of
    one device, through chunked prefill and preemption."""
    gemma = {k: v for k, v in TINY_LLAMA.items() if k != "tie_word_embeddings"} | dict(
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8, query_pre_attn_scalar=16)
    model_dir = save_tiny_llama(tmp_path / "gemma2", smollm2_tokenizer_dir, gemma, config_class="Gemma2Config")
    one, two = run_json_worker("tests.parallel.kv_groups_worker", [str(model_dir)], 2, WORKER_TIMEOUT_S)
    assert one["num_groups"] == two["num_groups"] == 2 and two["kv_shards"] == 2
    assert one["preemptions"] > 0
    assert two["tokens"] == one["tokens"]
    assert two["logprobs"] == pytest.approx(one["logprobs"], abs=1e-4)


def test_embedded_smollm2_at_tp3(other_results):
    assert_matches_single_device(other_results["smollm2"])


def test_layout_options_and_their_errors():
    """-tp/-dp parse to vLLM's option names; impossible layouts name the option, head counts and devices."""
    import argparse
    import dataclasses

    from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
    from jaxpaged.config import EngineConfig
    from jaxpaged.models.registry import read_model_config
    from jaxpaged.runner.mesh import check_parallel_layout

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_options_from_args(parser.parse_args(["-tp", "2", "--data-parallel-size", "3"])) == dict(
        tensor_parallel_size=2, data_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size: must be a positive int"):
        EngineConfig.from_options(tensor_parallel_size=0)
    model = read_model_config(dict(TINY_LLAMA, architectures=["LlamaForCausalLM"]))  # 4 q heads, 2 kv heads
    with pytest.raises(ValueError, match=r"tensor_parallel_size: .* 8 devices are needed, but only 4 exist "
                                         r"\(model: 4 q heads, 2 kv heads; 4 devices\)"):
        check_parallel_layout(model, 4, 2, num_devices=4)
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 must divide the number of q heads"):
        check_parallel_layout(model, 3, 1, num_devices=4)
    with pytest.raises(ValueError, match="kv heads, or be a multiple of it"):
        check_parallel_layout(dataclasses.replace(model, num_q_heads=12, num_kv_heads=3), 2, 1, num_devices=4)
    check_parallel_layout(model, 4, 1, num_devices=4)  # 2 kv heads at tp 4: each replicated twice


def test_expert_parallel_over_data_parallel_ranks_needs_experts_divisible_by_dp_x_tp():
    """enable_expert_parallel with dp > 1 places the experts over dp x tp devices (ranks in lock step): a count that
    dp x tp does not divide, or several processes, is refused naming the option; 8 experts over 4 devices, width
    splitting, and a dense model at dp 2 stand."""
    import dataclasses

    from jaxpaged.models.moe_decoder import MoeModelConfig, moe_fields
    from jaxpaged.models.registry import read_model_config
    from jaxpaged.runner.mesh import check_parallel_layout

    dense = read_model_config(dict(TINY_LLAMA, architectures=["LlamaForCausalLM"]))
    moe = MoeModelConfig(**moe_fields(dense), num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                         expert_parallel=True)
    with pytest.raises(ValueError, match=r"enable_expert_parallel: data_parallel_size \(2\) x tensor_parallel_size "
                                         r"\(2\) = 4 devices must divide the number of experts \(6\)"):
        check_parallel_layout(dataclasses.replace(moe, num_experts=6), 2, 2, num_devices=4)
    with pytest.raises(ValueError, match=r"enable_expert_parallel: .* run on one host only, got 2 processes"):
        check_parallel_layout(moe, 2, 2, num_devices=4, num_processes=2)
    check_parallel_layout(moe, 2, 2, num_devices=4)
    check_parallel_layout(moe, 2, 1, num_devices=4)
    check_parallel_layout(dataclasses.replace(moe, expert_parallel=False), 2, 2, num_devices=4)
    check_parallel_layout(dense, 2, 2, num_devices=4)

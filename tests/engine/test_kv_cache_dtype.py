"""kv_cache_dtype through the engine: the option and its flag, refusals before any weight is read, the pool's block
count at a fixed kv_cache_memory, and int8 KV under the cache's own machinery (prefix hits with token-granular block
copies, recompute preemption, the host and disk tiers, whose fingerprint keeps formats apart), plus /metrics."""

import argparse
import logging

import pytest

from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
from jaxpaged.config import EngineConfig
from jaxpaged.kernels.attention_dispatch import check_kv_cache_dtype
from jaxpaged.models.registry import read_model_config
from jaxpaged.runner.kv_cache import kv_storage_dtype, num_kv_blocks_for
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA
from tests.prefix_prompts import ask, same_completion, token_ids

INT8_OPTIONS = dict(TINY_ENGINE_OPTIONS, kv_cache_dtype="int8")


def test_the_option_and_its_flag():
    assert EngineConfig.from_options().cache.kv_cache_dtype == "auto"
    assert EngineConfig.from_options(kv_cache_dtype="fp8").cache.kv_cache_dtype == "fp8_e4m3"  # vLLM's alias
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_options_from_args(parser.parse_args(["--kv-cache-dtype", "int8"]), {})["kv_cache_dtype"] == "int8"
    with pytest.raises(SystemExit):  # argparse's choices come from the annotation
        parser.parse_args(["--kv-cache-dtype", "int4"])


def test_unknown_formats_and_backends_without_one_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="^kv_cache_dtype: must be one of"):
        EngineConfig.from_options(kv_cache_dtype="fp8_e5m2")
    for backend in ("pallas_gpu", "pallas_tpu"):  # pallas_tpu: the packed quantized layout (kv_layout_quantized.py)
        assert EngineConfig.from_options(kv_cache_dtype="int8", attention_backend=backend).cache.kv_cache_dtype
    check_kv_cache_dtype("int8", "auto")  # "auto" is xla on this CPU


def test_auto_on_an_accelerator_runs_a_quantized_cache(monkeypatch):
    """"auto" resolves to pallas_tpu on a TPU, pallas_gpu on a GPU: both have a quantized layout."""
    import jax

    for platform in ("tpu", "gpu"):
        monkeypatch.setattr(jax, "default_backend", lambda platform=platform: platform)
        check_kv_cache_dtype("int8", "auto")
        check_kv_cache_dtype("auto", "auto")


def test_a_refusal_comes_before_the_weights_load(tmp_path, caplog):
    from jaxpaged.llm import LLM

    with caplog.at_level(logging.INFO, logger="jaxpaged"):
        with pytest.raises(ValueError, match="^kv_cache_dtype:"):
            LLM(str(tmp_path / "no-model-here"), kv_cache_dtype="fp8_e5m2", compilation_cache_dir="")
    assert not caplog.records  # nothing loaded, nothing planned


@pytest.mark.parametrize("head_dim,int8_over_bfloat16,int8_over_float32",
                         [(16, 32 / 18, 64 / 18), (64, 128 / 66, 256 / 66), (128, 256 / 130, 512 / 130)])
def test_the_same_memory_holds_about_twice_the_bfloat16_blocks(head_dim, int8_over_bfloat16, int8_over_float32):
    """A row of head_dim codes carries SCALE_BYTES = 2 more: bfloat16's 2 * head_dim bytes over head_dim + 2."""
    model = read_model_config(dict(TINY_LLAMA, head_dim=head_dim, model_type="llama"))
    memory = EngineConfig.from_options(kv_cache_memory="64MiB").cache
    blocks = {name: num_kv_blocks_for(model, memory, kv_storage_dtype(dtype, kv), layout=layout)
              for name, dtype, kv, layout in (("float32", "float32", "auto", "interleaved"),
                                              ("bfloat16", "bfloat16", "auto", "interleaved_bits"),
                                              ("int8", "float32", "int8", "quantized"),
                                              ("fp8", "bfloat16", "fp8_e4m3", "quantized"))}
    assert blocks["int8"] == blocks["fp8"]  # the model dtype no longer matters: both are 1-byte codes
    assert blocks["int8"] / blocks["bfloat16"] == pytest.approx(int8_over_bfloat16, rel=1e-3)
    assert blocks["int8"] / blocks["float32"] == pytest.approx(int8_over_float32, rel=1e-3)


@pytest.fixture(scope="module")
def int8_llm(tiny_model_dir):
    from jaxpaged.llm import LLM

    return LLM(str(tiny_model_dir), **INT8_OPTIONS)


@pytest.fixture(scope="module")
def int8_llm_without_prefix_cache(tiny_model_dir):
    """The reference for cache hits: every token recomputed, the same codes written."""
    from jaxpaged.llm import LLM

    return LLM(str(tiny_model_dir), **INT8_OPTIONS, enable_prefix_caching=False)


def test_the_engine_plans_and_sizes_an_int8_pool(int8_llm):
    runner = int8_llm.engine.runner
    assert runner.kv_layout == "quantized" and str(runner.kv_cache.dtype) == "int8"
    assert "kv_cache_dtype int8" in runner.plan.describe()
    assert "per token in int8 + a bfloat16 scale per token per head" in runner.plan.describe()
    per_token = 2 * TINY_LLAMA["num_hidden_layers"] * TINY_LLAMA["num_key_value_heads"] * (TINY_LLAMA["head_dim"] + 2)
    assert runner.memory_plan.kv_bytes_per_token == per_token
    cache = EngineConfig.from_options(kv_cache_memory=200 * 16 * per_token, kv_cache_dtype="int8").cache
    assert num_kv_blocks_for(runner.model_config, cache, runner.kv_cache.dtype, layout=runner.kv_layout) == 200


def test_prefix_hits_full_and_token_granular_equal_recomputing(int8_llm, int8_llm_without_prefix_cache):
    """A repeat hits all but its last token (2 full blocks, 4 tokens of a copied third); a prompt sharing 20 tokens
    hits 16 + 4 (the partly matching block copied, then written on)."""
    prompt = token_ids(1, 37)
    first, again = ask(int8_llm, prompt), ask(int8_llm, prompt)
    assert again.num_cached_tokens == 36 and same_completion(again, first)
    sharing = prompt[:20] + token_ids(2, 9)
    hit = ask(int8_llm, sharing)
    assert hit.num_cached_tokens == 20
    assert same_completion(hit, ask(int8_llm_without_prefix_cache, sharing))
    assert same_completion(first, ask(int8_llm_without_prefix_cache, prompt))


def test_preemption_recomputes_the_same_tokens(int8_llm, int8_llm_without_prefix_cache):
    """16 requests of 100 + 30 tokens need 9 blocks each; the 47 usable blocks force recompute preemption."""
    prompts = [{"prompt_token_ids": token_ids(10 + i, 100)} for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=1)
    before = int8_llm.engine.get_stats().num_preemptions
    got = int8_llm.generate(prompts, params, use_tqdm=False)
    assert int8_llm.engine.get_stats().num_preemptions > before
    for prompt, output in zip(prompts, got):
        assert same_completion(output, int8_llm_without_prefix_cache.generate(prompt, params, use_tqdm=False)[0])


TIER_OPTIONS = dict(INT8_OPTIONS, num_kv_blocks=31, max_model_len=480, kv_offload_min_load_blocks=1)


def test_the_host_tier_brings_back_int8_blocks_with_their_scales(tiny_model_dir, int8_llm_without_prefix_cache):
    """a's 12 full blocks leave the 30-block pool for host memory when b's 30 blocks come, and come back for a's
    repeat."""
    from jaxpaged.llm import LLM

    llm = LLM(str(tiny_model_dir), **TIER_OPTIONS, kv_offload_memory="16MiB")
    a, b = token_ids(3, 200), token_ids(4, 470)
    first = ask(llm, a)
    ask(llm, b)
    again = ask(llm, a)
    assert llm.engine.get_stats().kv_tiers["host"].hit_blocks == 12 and again.num_cached_tokens == 192
    assert same_completion(again, first) and same_completion(again, ask(int8_llm_without_prefix_cache, a))


def test_a_disk_tier_is_read_back_by_its_own_format_only(tiny_model_dir, tmp_path):
    from jaxpaged.llm import LLM

    prompt = token_ids(5, 100)
    writer = LLM(str(tiny_model_dir), **TIER_OPTIONS, kv_offload_dir=str(tmp_path))
    expected = ask(writer, prompt)
    writer.close()  # persists the pool's cached blocks
    for kv_cache_dtype, hits in (("auto", 0), ("int8", 6)):
        options = dict(TIER_OPTIONS, kv_cache_dtype=kv_cache_dtype)
        llm = LLM(str(tiny_model_dir), **options, kv_offload_dir=str(tmp_path))
        answer = ask(llm, prompt)
        assert llm.engine.get_stats().kv_tiers["disk"].hit_blocks == hits, kv_cache_dtype
        if hits:
            assert same_completion(answer, expected)
        llm.close()


def test_metrics_name_the_kv_format(int8_llm):
    from jaxpaged.async_engine import AsyncLLMEngine
    from jaxpaged.server.metrics import ServerMetrics

    text = ServerMetrics(AsyncLLMEngine(int8_llm.engine), "tiny").render().decode()
    per_token = int8_llm.engine.runner.memory_plan.kv_bytes_per_token
    assert (f'jaxpaged_cache_config_info{{block_size="16",kv_bytes_per_token="{per_token}",kv_cache_dtype="int8",'
            f'kv_format="int8 + a bfloat16 scale per token per head",num_kv_blocks="48"}} 1.0') in text
    assert ('vllm:cache_config_info{block_size="16",cache_dtype="int8",engine="0",model_name="tiny",'
            'num_gpu_blocks="48"} 1.0' in text)


@pytest.mark.slow
def test_pallas_gpu_interpreted_gives_the_xla_backends_tokens(tiny_model_dir):
    """Chunked prefill and decodes over an int8 pool through the GPU kernel (interpret mode) and through the xla
    backend: the same greedy tokens and log-probabilities (fp8 and the edge lengths: tests/kernels)."""
    from jaxpaged.llm import LLM

    options = dict(INT8_OPTIONS, max_num_seqs=2, max_num_batched_tokens=16)
    prompts = [token_ids(20, 5), token_ids(21, 23)]  # the second longer than a step: prefilled in two chunks
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    answers = {}
    for backend in ("xla", "pallas_gpu"):
        llm = LLM(str(tiny_model_dir), **dict(options, attention_backend=backend))
        assert llm.engine.runner.kv_layout == "quantized"
        answers[backend] = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for got, want in zip(answers["pallas_gpu"], answers["xla"]):
        assert same_completion(got, want)

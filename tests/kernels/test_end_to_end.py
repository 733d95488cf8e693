"""Greedy generation through each Pallas kernel (interpret mode on CPU) equals the "xla" backend."""

import pytest

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    # Longer than the 16-token step budget: prefilled in chunks, decodes mixed into the same steps.
    "In the beginning of the twentieth century, the small town by the river had only one school and",
]
# One 16-token bucket: the interpreted kernels compile once each. Room for all three prompts at once: the long one's
# second chunk shares a step with the others' decodes (the kernels' mixed case; with two sequences at a time no step
# mixed them), and the interpreted kernels run 7 steps, not 13 (their run time was a third of an engine's CPU).
ENGINE_OPTIONS = TINY_ENGINE_OPTIONS | dict(max_num_seqs=3, max_num_batched_tokens=16)


def _greedy_token_ids(model_dir, backend: str) -> list[list[int]]:
    llm = LLM(str(model_dir), **(ENGINE_OPTIONS | dict(attention_backend=backend)))
    assert llm.engine.runner.backend == backend
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def xla_token_ids(tiny_model_dir) -> list[list[int]]:
    """The pure-jnp backend's greedy continuations: what every kernel must reproduce."""
    return _greedy_token_ids(tiny_model_dir, "xla")


@pytest.mark.parametrize("backend", ["pallas_gpu", "pallas_tpu"])
def test_greedy_generation_matches_xla_backend(backend, tiny_model_dir, xla_token_ids):
    """Chunked prefill + decode through the kernel gives the xla backend's tokens exactly."""
    assert all(len(ids) == 6 for ids in xla_token_ids)
    assert _greedy_token_ids(tiny_model_dir, backend) == xla_token_ids


def test_packed_tpu_cache_layout_matches_xla_backend(tmp_path, smollm2_tokenizer_dir):
    """head_dim 64: pallas_tpu gets the packed uint32 cache (K and V of a head side by side in one 128-lane row)
    and still reproduces the xla backend's greedy tokens through chunked prefill and decode."""
    from tests.conftest import TINY_LLAMA, save_tiny_llama

    model_dir = save_tiny_llama(tmp_path / "hd64", smollm2_tokenizer_dir,
                                TINY_LLAMA | dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                                                  head_dim=64))
    expected = _greedy_token_ids(model_dir, "xla")
    llm = LLM(str(model_dir), **(ENGINE_OPTIONS | dict(attention_backend="pallas_tpu")))
    runner = llm.engine.runner
    assert runner.kv_layout == "packed"
    assert runner.kv_cache.dtype == "uint32" and runner.kv_cache.shape[2:] == (16, 128)  # 16-token pages, 1 row each
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params, use_tqdm=False)] == expected


def test_packed_tpu_cache_with_two_rows_per_token_matches_xla_backend(tmp_path, smollm2_tokenizer_dir):
    """(8, 2, 128) in bfloat16: a token is two uint32 rows of the packed cache, so a page's rows are not its slots;
    layer 1's slots must move by pages of tokens (they moved by rows, writing past the pool). Greedy tokens equal
    the xla backend's through chunked prefill and decode."""
    from tests.conftest import TINY_LLAMA, save_tiny_llama

    model_dir = save_tiny_llama(tmp_path / "hd128", smollm2_tokenizer_dir,
                                TINY_LLAMA | dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                                                  head_dim=128))
    options = ENGINE_OPTIONS | dict(dtype="bfloat16", num_kv_blocks=24)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    token_ids = {}
    for backend in ("xla", "pallas_tpu"):
        llm = LLM(str(model_dir), **(options | dict(attention_backend=backend)))
        token_ids[backend] = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params, use_tqdm=False)]
        if backend == "pallas_tpu":
            assert llm.engine.runner.kv_layout == "packed"
            assert llm.engine.runner.kv_cache.shape[-2:] == (32, 128)  # 16-token pages, 2 rows each
    assert token_ids["pallas_tpu"] == token_ids["xla"]

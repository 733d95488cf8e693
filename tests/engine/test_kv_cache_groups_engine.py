"""KV cache groups end to end (issue 59): tiny Gemma 2, Gemma 3 and Mistral-with-window models generate HF's greedy
tokens with prompts several windows long, through chunked prefill, preemption, recompute and prefix hits; groups on
and off give identical tokens and log-probabilities; a pool too small for every token of every layer at max_model_len
starts and serves a max_model_len request when the windows make it fit."""

import random

import pytest
import torch
import transformers

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from tests.models.conftest import THREE_LAYERS, TINY
from tests.models.test_hf_parity import hf_greedy, save_with_tokenizer

pytestmark = pytest.mark.xdist_group("kv_cache_groups_engine")

NEW_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=1)
ENGINE = dict(dtype="float32", attention_backend="xla", compilation_cache_dir="", max_num_seqs=4,
              max_num_batched_tokens=16)

CONFIGS = {
    "gemma2": lambda: transformers.Gemma2Config(**TINY, tie_word_embeddings=True, sliding_window=8,
                                                query_pre_attn_scalar=12, attn_logit_softcapping=3.0,
                                                final_logit_softcapping=2.0),
    # Full attention in the middle: three groups of one layer (full; window 8; window 8).
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **THREE_LAYERS, tie_word_embeddings=True, sliding_window=8, query_pre_attn_scalar=12,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0}}),
    "mistral": lambda: transformers.MistralConfig(**TINY, tie_word_embeddings=False, sliding_window=16),
}
BLOCK_SIZES = {"gemma2": 4, "gemma3": 4, "mistral": 8}
WINDOWS = {"gemma2": 8, "gemma3": 8, "mistral": 16}
POOL_BLOCKS = {"gemma2": 48, "gemma3": 48, "mistral": 12}
"""Blocks that four of test_long_prompts' requests outgrow (Mistral's one sliding group holds 5 blocks a request)."""


def save_checkpoint(family: str, directory, tokenizer_dir) -> transformers.PreTrainedModel:
    """A seeded random tiny model of `family` saved (float32) beside a tokenizer; returned in eval mode."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family](), dtype=torch.float32).eval()
    return save_with_tokenizer(model, directory, tokenizer_dir)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family_llm(request, tmp_path_factory, smollm2_tokenizer_dir):
    """(family, HF model, engine with groups on over a pool that must preempt four long requests at once)."""
    family = request.param
    directory = tmp_path_factory.mktemp(f"kvgroups-{family}")
    model = save_checkpoint(family, directory, smollm2_tokenizer_dir)
    llm = LLM(str(directory), block_size=BLOCK_SIZES[family], num_kv_blocks=POOL_BLOCKS[family], max_model_len=128,
              **ENGINE)
    yield family, model, llm, directory


def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 160) for _ in range(n)] for n in lengths]


def generate(llm, token_prompts):
    return llm.generate([{"prompt_token_ids": p} for p in token_prompts], GREEDY, use_tqdm=False)


def test_groups_follow_the_layers_attention_kinds(family_llm):
    """Gemma 2: a full and a sliding group; Gemma 3 (sliding, full, sliding): three groups of one layer; Mistral
    with a window on every layer: one sliding group."""
    family, _, llm, _ = family_llm
    windows = llm.engine.runner.plan.kv_spec.group_windows
    expected = {"gemma2": (None, 8), "gemma3": (None, 8, 8), "mistral": (16,)}[family]
    assert windows == expected


def test_long_prompts_match_hf_through_chunks_and_preemption(family_llm):
    """Four prompts of 4-5 windows, prefilled in 16-token chunks, more than the pool holds at once (preemption and
    recompute): each generates HF's greedy tokens, and the sliding groups gave blocks back as they went."""
    family, model, llm, _ = family_llm
    window = WINDOWS[family]
    token_prompts = prompts(1, [4 * window + 3, 5 * window, 4 * window + 1, 4 * window + 7])
    before = llm.engine.get_stats().num_preemptions
    outputs = generate(llm, token_prompts)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy(model, token_prompts, NEW_TOKENS)
    assert llm.engine.get_stats().num_preemptions > before


def test_prefix_hits_reuse_the_window_and_give_the_same_tokens(family_llm):
    """A prompt sharing 21 tokens with a finished one, then branching, hits at least its whole blocks; the same
    prompts again hit and generate the same tokens with the same log-probabilities. (Prompts short enough that the
    small pool keeps what they need: a sliding group's early blocks go back to the pool first, and go first.)"""
    _, _, llm, _ = family_llm
    assert llm.reset_prefix_cache()
    token_prompts = prompts(2, [24, 28])
    first = [generate(llm, [token_prompts[0]])[0]]
    branched = token_prompts[0][:21] + [5, 6, 7]
    assert generate(llm, [branched])[0].num_cached_tokens >= 16
    first.append(generate(llm, [token_prompts[1]])[0])
    again = [generate(llm, [p])[0] for p in token_prompts]
    for got, want in zip(again, first):
        assert got.num_cached_tokens >= 16
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.outputs[0].cumulative_logprob == pytest.approx(want.outputs[0].cumulative_logprob, abs=1e-4)


@pytest.mark.parametrize("family_llm", [pytest.param("gemma2", marks=pytest.mark.slow), "gemma3",
                                        pytest.param("mistral", marks=pytest.mark.slow)], indirect=True)
def test_groups_on_and_off_give_identical_tokens(family_llm):
    """--disable-hybrid-kv-cache-manager (every layer keeps every token) generates the very tokens and
    log-probabilities of the groups, for prompts several windows long with a shared prefix. (A second engine each:
    Gemma 3's three groups run in the quick suite, the other two families with the slow tests.)"""
    family, _, llm, directory = family_llm
    window = WINDOWS[family]
    base = prompts(3, [5 * window])[0]
    token_prompts = [base + [9, 10, 11], base[:3 * window + 2], base]
    assert llm.reset_prefix_cache()
    grouped = generate(llm, token_prompts)
    off = LLM(str(directory), block_size=BLOCK_SIZES[family], num_kv_blocks=80, max_model_len=128,
              disable_hybrid_kv_cache_manager=True, **ENGINE)
    assert off.engine.runner.plan.kv_spec.num_groups == 1
    for got, want in zip(grouped, generate(off, token_prompts)):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert got.outputs[0].cumulative_logprob == pytest.approx(want.outputs[0].cumulative_logprob, abs=1e-4)


def test_a_pool_too_small_for_every_layer_serves_max_model_len_with_groups(tmp_path, smollm2_tokenizer_dir):
    """Gemma 2 (2 layers, window 8, 4-token blocks): 43 KiB of KV holds 21 blocks of both layers, not the 32 one
    128-token sequence needs, so groups off refuse to start; with groups a block is one layer's page (42 blocks)
    and a sequence needs 32 full + 3 sliding: a 122-token prompt generates HF's tokens."""
    model = save_checkpoint("gemma2", tmp_path, smollm2_tokenizer_dir)
    options = dict(ENGINE, block_size=4, max_model_len=128, kv_cache_memory=42 * 1024)
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(tmp_path), disable_hybrid_kv_cache_manager=True, **options)
    llm = LLM(str(tmp_path), **options)
    assert llm.engine.runner.num_kv_blocks == 42
    token_prompts = prompts(4, [122])
    outputs = generate(llm, token_prompts)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy(model, token_prompts, NEW_TOKENS)


def test_scanned_layers_read_their_groups_tables(tmp_path, smollm2_tokenizer_dir, monkeypatch):
    """With the layers stacked under a scan (as on TPU), each layer's group and pool slot are traced values: Gemma
    3's three groups generate HF's tokens for prompts of 4-6 windows, prefilled in chunks."""
    from jaxpaged.runner import startup as startup_module

    model = save_checkpoint("gemma3", tmp_path, smollm2_tokenizer_dir)
    monkeypatch.setattr(startup_module, "unroll_layers_on", lambda platform: False)
    llm = LLM(str(tmp_path), block_size=4, num_kv_blocks=64, max_model_len=128, **ENGINE)
    plan = llm.engine.runner.plan
    assert not plan.per_layer and plan.kv_spec.num_groups == 3
    token_prompts = prompts(5, [37, 45])
    outputs = generate(llm, token_prompts)
    assert [list(o.outputs[0].token_ids) for o in outputs] == hf_greedy(model, token_prompts, NEW_TOKENS)

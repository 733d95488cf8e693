"""jaxpaged's logits match HF transformers (torch, float32) for tiny random models of every supported family."""

import pathlib
import shutil

import numpy as np
import pytest
import torch

from jaxpaged.config import EngineConfig
from jaxpaged.core.request import Request
from jaxpaged.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxpaged.runner.model_runner import ModelRunner
from jaxpaged.weights.loader import load_model

BLOCK_SIZE = 4
REL_TOL = 1e-4


@pytest.fixture(scope="session")
def runner_and_hf(tiny_checkpoint):
    family, hf_model, directory = tiny_checkpoint
    config = EngineConfig.from_options(block_size=BLOCK_SIZE, num_kv_blocks=64, max_model_len=64,
                                       max_num_batched_tokens=32, max_num_seqs=16, dtype="float32",
                                       attention_backend="xla",
                                       disable_hybrid_kv_cache_manager=True)
    return ModelRunner(load_model(str(directory)), config), hf_model


def hf_logits(hf_model, token_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].numpy()


def run_step(runner: ModelRunner, parts: list[tuple[list[int], int, list[int]]]) -> np.ndarray:
    """Compute one ragged step of (token_ids, start_position, block_ids) parts; logits of every real token row."""
    scheduled = [ScheduledRequest(Request(f"r{i}", tokens), tokens, start, blocks, True)
                 for i, (tokens, start, blocks) in enumerate(parts)]
    output = SchedulerOutput(scheduled, sum(len(p[0]) for p in parts), set(), set())
    bucket, batch = runner.prepare(output)
    num_rows = output.num_scheduled_tokens
    assert num_rows <= bucket.num_seqs
    batch.sample_indices[:num_rows] = np.arange(num_rows)  # every row's logits, not only the last of each sequence
    return np.asarray(runner.compute_logits(bucket, batch))[:num_rows]


def hf_greedy(hf_model, prompts: list[list[int]], num_new_tokens: int) -> list[list[int]]:
    """HF's greedy generate from token ids alone, exactly num_new_tokens after each prompt."""
    continuations = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_new_tokens,
                                    min_new_tokens=num_new_tokens, do_sample=False)
        continuations.append(out[0, len(prompt):].tolist())
    return continuations


def save_with_tokenizer(model, directory: pathlib.Path, tokenizer_dir: pathlib.Path):
    """`model` (a random HF model) saved beside a tokenizer, its norms perturbed first (HF initialises them to
    constants, which would hide a misplaced norm); returned in eval mode."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return model.eval()


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    rel = np.max(np.abs(actual - expected)) / np.max(np.abs(expected))
    assert rel < REL_TOL, f"relative error {rel:.2e}"


def random_tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 160, n).tolist()


def test_plain_prefill_spanning_blocks(runner_and_hf):
    """A 13-token prompt (block size 4: 3 full blocks + 1 token) in one step matches HF at every position."""
    runner, hf_model = runner_and_hf
    tokens = random_tokens(1, 13)
    got = run_step(runner, [(tokens, 0, [1, 2, 3, 4])])
    assert_close(got, hf_logits(hf_model, tokens))


@pytest.mark.parametrize("prompt_len", [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1])
def test_prefill_edge_lengths(runner_and_hf, prompt_len):
    """Prompts of 1, block-1, block and block+1 tokens."""
    runner, hf_model = runner_and_hf
    tokens = random_tokens(prompt_len, prompt_len)
    got = run_step(runner, [(tokens, 0, [5, 6])])
    assert_close(got, hf_logits(hf_model, tokens))


def test_mixed_ragged_batch_with_chunked_prefill_and_decode(runner_and_hf):
    """One step mixing a prefill continuation, a decode and a fresh prefill, on shuffled block ids."""
    runner, hf_model = runner_and_hf
    a, b, c = random_tokens(2, 6), random_tokens(3, 10), random_tokens(4, 5)
    blocks_a, blocks_b, blocks_c = [9, 3], [17, 8, 12], [20, 7]
    run_step(runner, [(a[:3], 0, blocks_a), (b[:9], 0, blocks_b)])
    got = run_step(runner, [(a[3:], 3, blocks_a), (b[9:], 9, blocks_b), (c, 0, blocks_c)])
    assert_close(got[:3], hf_logits(hf_model, a)[3:])
    assert_close(got[3:4], hf_logits(hf_model, b)[9:])
    assert_close(got[4:], hf_logits(hf_model, c))


def test_long_prompt_over_many_blocks_in_chunks(runner_and_hf):
    """A 40-token prompt (10 blocks) prefilled in chunks of 16, 16 and 8 matches HF."""
    runner, hf_model = runner_and_hf
    tokens = random_tokens(5, 40)
    blocks = [30, 31, 25, 26, 27, 40, 41, 42, 43, 50]
    pieces = [run_step(runner, [(tokens[s:s + 16], s, blocks)]) for s in (0, 16, 32)]
    assert_close(np.concatenate(pieces), hf_logits(hf_model, tokens))


def test_greedy_generation_through_the_engine_equals_hf_generate(tiny_checkpoint, smollm2_tokenizer_dir, tmp_path):
    """The whole engine (chunked prefill in 8-token steps, paged decode) on a 20-token prompt, longer than the
    Gemma families' 8-token window, generates HF's greedy tokens exactly."""
    import shutil

    from jaxpaged.llm import LLM
    from jaxpaged.sampling.params import SamplingParams

    family, hf_model, directory = tiny_checkpoint
    model_dir = tmp_path / family  # the checkpoint beside a tokenizer, as LLM needs one
    shutil.copytree(directory, model_dir)
    shutil.copy(smollm2_tokenizer_dir / "tokenizer.json", model_dir / "tokenizer.json")
    shutil.copy(smollm2_tokenizer_dir / "tokenizer_config.json", model_dir / "tokenizer_config.json")
    prompt = random_tokens(6, 20)
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8,
                                     pad_token_id=0)[0, len(prompt):].tolist()
    llm = LLM(str(model_dir), block_size=BLOCK_SIZE, max_model_len=64, max_num_batched_tokens=8, max_num_seqs=2,
              dtype="float32", attention_backend="xla", compilation_cache_dir="")
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    [output] = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
    assert list(output.outputs[0].token_ids) == expected

"""Sequences a KV pool holds with and without KV cache groups (issue 59), in the same KV bytes.

Two readings:
  1. the memory plan's "N sequences of max_model_len fit" at 32k for a Gemma-3-27B-shaped model (62 layers, 5 local
     of window 1024 : 1 global, 16 KV heads of 128) and a gpt-oss-shaped one (36 layers alternating window 128 and
     full, 8 KV heads of 64), groups off (--disable-hybrid-kv-cache-manager) against on;
  2. a run that actually holds them: a tiny random Gemma-3-like model (6 layers, 5 local of window --window : 1
     global) in a pool of --kv-mib MiB (default: what 3 sequences need without groups), --requests prompts of
     max_model_len - 128 tokens at once, each decoding 128 (long enough that every admitted request is decoding at
     once); the most requests decoding together (their whole prompt
     in the pool), groups off against on.

    python -m benchmarks.kv_groups_capacity [--max-model-len 2048 --window 64 --requests 16]
"""

import argparse
import random
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.runner.memory_plan import plan_memory

NEW_TOKENS = 128
"""Tokens each request of the run decodes."""
KV_BYTES = 64 * 2**30
"""The KV bytes of the plan readings: one 80 GiB accelerator's pool after the weights, roughly."""


def shaped(num_layers: int, window: int, sliding: tuple[bool, ...], kv_heads: int, head_dim: int) -> ModelConfig:
    """The KV-relevant shape of a model (the rest does not size the pool)."""
    return ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=64,
                       num_layers=num_layers, num_q_heads=2 * kv_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768,
                       tie_word_embeddings=True, sliding_window=window, layer_is_sliding=sliding)


def plan_sequences(model: ModelConfig, hybrid: bool, max_model_len: int = 32768, block_size: int = 16) -> int:
    """Sequences of max_model_len the memory plan fits in KV_BYTES of bfloat16 blocks."""
    probe = plan_memory(model, 0, 2, block_size, max_model_len, np.dtype("bfloat16"), 1, "interleaved",
                        platform="cpu", hybrid=hybrid)
    num_blocks = KV_BYTES // probe.kv_bytes_per_block_per_device
    return plan_memory(model, 0, num_blocks, block_size, max_model_len, np.dtype("bfloat16"), 1, "interleaved",
                       platform="cpu", hybrid=hybrid).max_sequences_at_max_model_len


def plan_readings() -> None:
    gemma = shaped(62, 1024, tuple(index % 6 != 5 for index in range(62)), 16, 128)
    oss = shaped(36, 128, tuple(index % 2 == 0 for index in range(36)), 8, 64)
    for name, model in (("Gemma-3-27B-shaped", gemma), ("gpt-oss-shaped", oss)):
        off, on = plan_sequences(model, False), plan_sequences(model, True)
        print(f"memory plan, {name}, {KV_BYTES / 2**30:.0f} GiB of KV, 32k tokens: groups off {off} sequences, "
              f"on {on} ({on / off:.2f}x)")


def save_tiny_gemma3(directory: Path, window: int, max_model_len: int) -> None:
    """A seeded random 6-layer Gemma-3-like model (5 local : 1 global) beside the embedded tokenizer."""
    import torch
    import transformers

    from jaxpaged.weights.loader import locate_model

    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=max_model_len, sliding_window=window,
        query_pre_attn_scalar=16, layer_types=["sliding_attention"] * 5 + ["full_attention"])
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer_dir = locate_model(None)[0]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)


def peak_running(directory: Path, hybrid: bool, kv_bytes: int, max_model_len: int,
                 num_requests: int) -> tuple[int, int]:
    """(most requests decoding at once, preemptions) for num_requests long prompts decoding NEW_TOKENS each."""
    from jaxpaged.engine.llm_engine import LLMEngine
    from jaxpaged.sampling.params import SamplingParams

    engine = LLMEngine.from_options(str(directory), dtype="float32", attention_backend="xla", block_size=16,
                                    max_model_len=max_model_len, max_num_seqs=num_requests,
                                    max_num_batched_tokens=512, kv_cache_memory=kv_bytes, enable_prefix_caching=False,
                                    disable_hybrid_kv_cache_manager=not hybrid, compilation_cache_dir="")
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    prompt_len = max_model_len - NEW_TOKENS
    for index in range(num_requests):
        prompt = [rng.randrange(3, 512) for _ in range(prompt_len)]
        engine.add_request(f"r{index}", {"prompt_token_ids": prompt}, params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        decoding = sum(1 for request in engine.scheduler.running if request.num_computed_tokens >= prompt_len)
        peak = max(peak, decoding)
    preemptions = engine.get_stats().num_preemptions
    engine.close()
    return peak, preemptions


def run_readings(max_model_len: int, window: int, num_requests: int, kv_mib: Optional[float]) -> None:
    # Page bytes of one layer's 16-token block: 16 tokens x 2 KV heads x (K, V) x 16 x float32.
    page = 16 * 2 * 2 * 16 * 4
    blocks_per_seq = -(-max_model_len // 16)
    # Default: the KV bytes that hold 3 sequences with every token of every layer.
    kv_bytes = int(kv_mib * 2**20) if kv_mib else (3 * blocks_per_seq + 1) * 6 * page
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        save_tiny_gemma3(directory, window, max_model_len)
        results = {hybrid: peak_running(directory, hybrid, kv_bytes, max_model_len, num_requests)
                   for hybrid in (False, True)}
    (off, off_preempt), (on, on_preempt) = results[False], results[True]
    print(f"run, tiny Gemma-3-like (6 layers, window {window}), {kv_bytes / 2**20:.2f} MiB of KV, {num_requests} "
          f"prompts of {max_model_len - NEW_TOKENS} tokens: most decoding at once, groups off {off} ({off_preempt} "
          f"preemptions), on {on} ({on_preempt} preemptions): {on / off:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--kv-mib", type=float, default=None, help="KV pool size (default: 3 full sequences)")
    parser.add_argument("--plan-only", action="store_true")
    args = parser.parse_args()
    plan_readings()
    if not args.plan_only:
        run_readings(args.max_model_len, args.window, args.requests, args.kv_mib)


if __name__ == "__main__":
    main()

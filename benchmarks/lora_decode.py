"""Batch-64 decode with 4 rank-16 LoRA adapters active against the base model's, same run, and the compiles while
the adapters load (issue 60's goal: >= 0.8x the base model's decode tok/s, and 0 compiles after warm-up).

A seeded random Llama (hidden 512, 4 layers; --hidden / --layers to change) is written as an HF checkpoint with four
random PEFT adapters of rank 16 on every attention and MLP projection. Two engines run in this process: the base
model (enable_lora off) and the same model with enable_lora (max_loras 4, max_lora_rank 16), 16 of the 64 rows on
each adapter. Decode tok/s is 64 x (long - short) / (its time - the short run's time) of two generate calls of
max_tokens long and short (prefix caching off, so both prefill alike), alternated base / LoRA for each repeat; the
medians are reported with the CPU and the load.

    python -m benchmarks.lora_decode [--repeats 3] [--hidden 512] [--layers 4]
"""

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from jaxpaged.bench.machine_info import machine_info

BATCH = 64
NUM_ADAPTERS = 4
RANK = 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_model(directory: pathlib.Path, hidden: int, layers: int) -> dict[str, Any]:
    """A seeded random Llama checkpoint; returns its config."""
    import torch
    import transformers

    config: dict[str, Any] = dict(
        vocab_size=8192, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128), head_dim=64,
        max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**config)).save_pretrained(directory)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=_word_level_tokenizer(config["vocab_size"]))
    tokenizer.save_pretrained(directory)
    return config


def _word_level_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def write_adapter(directory: pathlib.Path, config: dict, seed: int) -> None:
    """A random rank-16 PEFT adapter on every projection."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_dim, kv_dim = config["num_attention_heads"] * 64, config["num_key_value_heads"] * 64
    dims = {"q_proj": (hidden, q_dim), "k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim),
            "o_proj": (q_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            group = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{target}"
            inner, outer = dims[target]
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.02, (RANK, inner)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.02, (outer, RANK)).astype(np.float32)
    directory.mkdir(parents=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": RANK, "lora_alpha": 32, "target_modules": TARGETS, "bias": "none"}))


def timed_generate(llm, prompts, max_tokens: int, loras) -> float:
    from jaxpaged import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--short", type=int, default=4, help="max_tokens of the short run")
    parser.add_argument("--long", type=int, default=36, help="max_tokens of the long run")
    args = parser.parse_args()

    from jaxpaged import LLM, LoRARequest
    from jaxpaged.runner import compile_counter

    root = pathlib.Path(tempfile.mkdtemp(prefix="lora-bench-"))
    config = write_model(root / "model", args.hidden, args.layers)
    loras = []
    for index in range(NUM_ADAPTERS):
        write_adapter(root / f"adapter{index}", config, seed=index)
        loras.append(LoRARequest(f"adapter{index}", index + 1, str(root / f"adapter{index}")))
    options = dict(max_num_seqs=BATCH, max_num_batched_tokens=1024, max_model_len=256, dtype="float32",
                   enable_prefix_caching=False, compilation_cache_dir="")
    base = LLM(str(root / "model"), **options)
    lora = LLM(str(root / "model"), enable_lora=True, max_loras=NUM_ADAPTERS, max_lora_rank=RANK, **options)
    rng = np.random.default_rng(0)
    prompts = [{"prompt_token_ids": [1, *rng.integers(3, 8000, 15).tolist()]} for _ in range(BATCH)]
    row_loras = [loras[index % NUM_ADAPTERS] for index in range(BATCH)]
    compiles_after_warmup = compile_counter.num_compilations()
    timed_generate(base, prompts, args.short, None)  # first runs: host caches, adapters read and written to slots
    timed_generate(lora, prompts, args.short, row_loras)
    rates: dict[str, list[float]] = {"base": [], "lora": []}
    for _ in range(args.repeats):
        for name, llm, row in (("base", base, None), ("lora", lora, row_loras)):
            short = timed_generate(llm, prompts, args.short, row)
            long = timed_generate(llm, prompts, args.long, row)
            rates[name].append(BATCH * (args.long - args.short) / (long - short))
    compiles = compile_counter.num_compilations() - compiles_after_warmup
    base_rate, lora_rate = statistics.median(rates["base"]), statistics.median(rates["lora"])
    machine = machine_info()
    print(f"CPU: {machine.get('cpu')}  cores: {os.cpu_count()}  load at end: {os.getloadavg()}")
    print(f"model: random Llama hidden {args.hidden}, {args.layers} layers; batch {BATCH}, {NUM_ADAPTERS} rank-{RANK}"
          f" adapters on all 7 projections, float32")
    print(f"decode tok/s base: {base_rate:.0f}  ({', '.join(f'{r:.0f}' for r in rates['base'])})")
    print(f"decode tok/s LoRA: {lora_rate:.0f}  ({', '.join(f'{r:.0f}' for r in rates['lora'])})")
    print(f"LoRA / base: {lora_rate / base_rate:.2f}x (goal >= 0.8x)")
    print(f"compiles after warm-up while adapters loaded and ran: {compiles} (goal 0); slot writes: "
          f"{lora.engine.runner.lora.num_writes if lora.engine.runner.lora else 0}")


if __name__ == "__main__":
    main()

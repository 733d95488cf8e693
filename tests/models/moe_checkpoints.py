"""Tiny random mixture-of-experts checkpoints (Mixtral, gpt-oss) for the family tests: saved by transformers'
save_pretrained in bfloat16 beside a tokenizer, and the float32 HF model holding the same rounded weights."""

import pathlib
import shutil

import numpy as np
import torch
import transformers

from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams

VOCAB = 160


def save_moe_checkpoint(config: transformers.PretrainedConfig, directory: pathlib.Path, tokenizer_dir: pathlib.Path,
                        noise: float = 0.1, embed_gain: float = 1.0) -> transformers.PreTrainedModel:
    """A seeded random model of `config` with biases and norms moved by `noise` times a normal sample (HF initialises
    them to 0 and 1, which would hide a misplaced one), saved to `directory` in bfloat16; returned in float32 eval
    mode with those weights. `embed_gain` scales the embeddings up: where biases add the same vector to every
    token's residual (gpt-oss), HF's small random embeddings would drown and every prompt continue alike."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "sinks" in name:
                param.add_(noise * torch.randn_like(param))
        model.get_input_embeddings().weight.mul_(embed_gain)
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).to(torch.float32))
    model.eval()
    model.save_pretrained(directory, state_dict={name: value.to(torch.bfloat16)
                                                 for name, value in model.state_dict().items()})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return model


def engine_greedy(directory: pathlib.Path, prompts: list[list[int]], num_new_tokens: int,
                  block_size: int) -> list[list[int]]:
    """The engine's greedy continuations (float32, XLA attention, prefill chunks of 16 tokens)."""
    llm = LLM(str(directory), dtype="float32", attention_backend="xla", block_size=block_size, max_model_len=128,
              max_num_seqs=4, max_num_batched_tokens=16, num_kv_blocks=64, compilation_cache_dir="")
    params = SamplingParams(temperature=0.0, max_tokens=num_new_tokens, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def random_prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    """Prompts of random token ids (past the special ids) of the given lengths."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]

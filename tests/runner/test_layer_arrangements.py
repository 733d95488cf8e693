"""The arrangements of the weights (llama.DecoderLayers, models/packed_weights.py) compute the same step.

Stacked weights under `lax.scan` serve GPU and TPU; per-layer weights, unrolled, serve the CPU, where matmul weights
are also packed into panels for the native matmul (float32; bfloat16 where the CPU has AVX512-BF16). All runners here
run on the CPU, so the stacked and the unpacked paths are checked against the CPU's own, step by step, KV writes
included: on a Llama, on a Gemma 3 whose layers alternate sliding and full attention (a traced choice per scanned
layer, a fixed one per unrolled layer) with prompts past its window, and on models whose vocabulary head packs (tied or
not) or cannot (150 columns); packed bfloat16 against unpacked bfloat16.
"""

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import jaxpaged.runner.startup as startup_module
from jaxpaged.config import EngineConfig
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.kernels.cpu_native.packed_matmul import packed_bfloat16_available
from jaxpaged.runner.model_runner import ModelRunner
from tests.models.conftest import make_hf_checkpoint
from tests.runner.test_step_preparation import _scheduled


def _build_runner(model_dir, unrolled: bool, packed: bool, dtype: str) -> ModelRunner:
    from jaxpaged.weights.loader import load_model

    config = EngineConfig.from_options(block_size=4, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=16,
                                       max_num_seqs=4, dtype=dtype, attention_backend="xla",
                                       disable_hybrid_kv_cache_manager=True)
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(startup_module, "unroll_layers_on", lambda platform: unrolled)
        if not packed:
            patches.setattr(startup_module, "packs_weights_on", lambda platform, dtype, tp: False)
        return ModelRunner(load_model(str(model_dir)), config)


@pytest.fixture(scope="module")
def runner_of():
    """runner_of(model_dir, unrolled, packed=True, dtype="float32"): that arrangement's runner, built once for the file.

    The tests share arrangements (the packed tiny Llama is in four of them, each float32 packed runner also in the
    shapes test): 14 builds where there were 20, each loading the checkpoint and compiling its step. A reused runner
    computes what a fresh one does: its state is the weights and the KV pool, and every comparison writes each KV
    slot it reads (the same tokens to the same slots) before reading it.
    """
    built: dict[tuple, ModelRunner] = {}

    def runner(model_dir, unrolled: bool, packed: bool = True, dtype: str = "float32") -> ModelRunner:
        key = (str(model_dir), unrolled, packed, dtype)
        if key not in built:
            built[key] = _build_runner(model_dir, unrolled, packed, dtype)
        return built[key]

    return runner


@pytest.mark.parametrize("unrolled", [True, False])
def test_the_runner_picks_the_arrangement_its_platform_wants(tiny_model_dir, runner_of, unrolled):
    layers = runner_of(tiny_model_dir, unrolled).state["layers"]
    assert ("layers" in layers) == unrolled  # nnx.List of per-layer dicts, or stacked attributes


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma3")
    make_hf_checkpoint("gemma3", directory)  # sliding window 8, layers sliding / full / sliding
    return directory


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("untied")
    make_hf_checkpoint("llama", directory)  # an lm_head of 160 columns: 10 panels
    return directory


@pytest.fixture(scope="module")
def odd_vocab_dir(tmp_path_factory):
    import torch
    import transformers

    from tests.models.conftest import TINY

    directory = tmp_path_factory.mktemp("odd-vocab")
    torch.manual_seed(0)
    options: dict[str, Any] = {**TINY, "vocab_size": 150}
    config = transformers.Qwen2Config(**options, tie_word_embeddings=True)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def test_float32_cpu_runners_pack_every_matmul_weight_that_fills_whole_panels(tiny_model_dir, untied_dir,
                                                                              odd_vocab_dir, runner_of):
    tied = runner_of(tiny_model_dir, True).state
    assert tied["embed"].shape == (49152 // 16, 64, 16)  # the vocabulary projection, stored once
    layer = tied["layers"]["layers"][0]
    assert layer["q_proj"].shape == (64 // 16, 64, 16) and layer["down_proj"].shape == (64 // 16, 128, 16)
    assert layer["input_norm"].shape == (64,)
    untied = runner_of(untied_dir, True).state
    assert untied["embed"].shape == (160, 64) and untied["lm_head"].shape == (10, 64, 16)
    odd_vocab = runner_of(odd_vocab_dir, True).state
    assert odd_vocab["embed"].shape == (150, 64)  # 150 columns do not pack
    unpacked = runner_of(tiny_model_dir, True, packed=False).state
    assert unpacked["embed"].shape == (49152, 64) and unpacked["layers"]["layers"][0]["q_proj"].shape == (64, 64)


@pytest.mark.parametrize("model,arrangements", [
    ("llama", ["stacked", "packed"]), ("gemma3", ["stacked", "packed"]), ("llama", ["unpacked", "packed"]),
    ("untied", ["unpacked", "packed"]), ("odd_vocab", ["unpacked", "packed"])])
def test_every_arrangement_gives_the_same_logits(model, arrangements, tiny_model_dir, gemma3_dir, untied_dir,
                                                  odd_vocab_dir, runner_of):
    model_dir = {"llama": tiny_model_dir, "gemma3": gemma3_dir, "untied": untied_dir, "odd_vocab": odd_vocab_dir}[model]
    options = {"stacked": (False, False), "unpacked": (True, False), "packed": (True, True)}  # (unrolled, packed)
    runners = [runner_of(model_dir, *options[name]) for name in arrangements]
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    steps = [
        # a 9-token chunk of one prompt (not sampled) beside a whole 3-token prompt
        [_scheduled(prompt[:9], 0, [1, 2, 3], sample=False), _scheduled([31, 32, 33], 0, [5], sample=True)],
        # the prompt's last 2 tokens (past Gemma's window of 8), then a decode of the other request, both reading
        # the KV written above
        [_scheduled(prompt[9:], 9, [1, 2, 3], sample=True), _scheduled([34], 3, [5], sample=True)],
    ]
    for scheduled in steps:
        output = SchedulerOutput(scheduled, sum(len(s.token_ids) for s in scheduled), set(), set())
        # Only the sampled rows: the padding rows' logits are unspecified (the native matmul leaves them zero)
        num_sampled = sum(1 for item in scheduled if item.sample)
        logits = [np.asarray(runner.compute_logits(*runner.prepare(output)))[:num_sampled] for runner in runners]
        np.testing.assert_allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)
        assert np.abs(logits[0]).max() > 0


@pytest.mark.skipif(not packed_bfloat16_available(),
                    reason="bfloat16 weights pack only where the CPU has AVX512-BF16")
@pytest.mark.parametrize("model", ["llama", "untied"])
def test_bfloat16_packed_weights_give_the_unpacked_logits(model, tiny_model_dir, untied_dir, runner_of):
    # The packed bfloat16 matmul sums exact bfloat16 products in float32 as XLA's dot does, in another order: the
    # layers' bfloat16 outputs may round apart by one unit, so the logits agree to bfloat16's precision.
    model_dir = {"llama": tiny_model_dir, "untied": untied_dir}[model]
    packed = runner_of(model_dir, True, dtype="bfloat16")
    unpacked = runner_of(model_dir, True, packed=False, dtype="bfloat16")
    layer = packed.state["layers"]["layers"][0]
    assert layer["q_proj"].shape == (64 // 16, 64, 16) and layer["q_proj"].dtype == jnp.bfloat16
    head = packed.state["embed"] if model == "llama" else packed.state["lm_head"]
    assert head.ndim == 3  # the vocabulary projection packs too (a tied table is read by panel_columns)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    steps = [[_scheduled(prompt[:9], 0, [1, 2, 3], sample=False), _scheduled([31, 32, 33], 0, [5], sample=True)],
             [_scheduled(prompt[9:], 9, [1, 2, 3], sample=True), _scheduled([34], 3, [5], sample=True)]]
    for scheduled in steps:
        output = SchedulerOutput(scheduled, sum(len(s.token_ids) for s in scheduled), set(), set())
        num_sampled = sum(1 for item in scheduled if item.sample)  # the padding rows' logits are unspecified
        got, expected = (np.asarray(runner.compute_logits(*runner.prepare(output)))[:num_sampled]
                         for runner in (packed, unpacked))
        scale = np.abs(expected).max()
        assert scale > 0 and np.abs(got - expected).max() <= 0.02 * scale
        assert (got.argmax(-1) == expected.argmax(-1)).all()

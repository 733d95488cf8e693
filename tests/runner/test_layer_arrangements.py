"""The two arrangements of the decoder layers (llama.DecoderLayers) compute the same step.

Stacked weights under `lax.scan` serve GPU and TPU; per-layer weights, unrolled, serve the CPU. Both runners here
run on the CPU, so the stacked path is checked against the CPU's own, step by step, KV writes included: on a Llama,
and on a Gemma 3 whose layers alternate sliding and full attention (a traced choice per scanned layer, a fixed one
per unrolled layer) with prompts past its window.
"""

import numpy as np
import pytest

import jaxpaged.runner.model_runner as model_runner_module
from jaxpaged.config import EngineConfig
from jaxpaged.core.scheduler_output import SchedulerOutput
from tests.models.conftest import make_hf_checkpoint
from tests.runner.test_step_preparation import _scheduled


def _runner(model_dir, unrolled: bool, monkeypatch):
    from jaxpaged.weights.loader import load_model

    monkeypatch.setattr(model_runner_module, "unroll_layers_on", lambda platform: unrolled)
    config = EngineConfig.from_options(block_size=4, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=16,
                                       max_num_seqs=4, dtype="float32", attention_backend="xla")
    return model_runner_module.ModelRunner(load_model(str(model_dir)), config)


@pytest.mark.parametrize("unrolled", [True, False])
def test_the_runner_picks_the_arrangement_its_platform_wants(tiny_model_dir, monkeypatch, unrolled):
    layers = _runner(tiny_model_dir, unrolled, monkeypatch).state["layers"]
    assert ("layers" in layers) == unrolled  # nnx.List of per-layer dicts, or stacked attributes


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma3")
    make_hf_checkpoint("gemma3", directory)  # sliding window 8, layers sliding / full / sliding
    return directory


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_stacked_and_per_layer_weights_give_the_same_logits(model, tiny_model_dir, gemma3_dir, monkeypatch):
    model_dir = tiny_model_dir if model == "llama" else gemma3_dir
    runners = [_runner(model_dir, unrolled, monkeypatch) for unrolled in (False, True)]
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
        logits = [np.asarray(runner.compute_logits(*runner.prepare(output))) for runner in runners]
        np.testing.assert_allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)
        assert np.abs(logits[0]).max() > 0

"""int8 projections compute the same step in every weight arrangement: stacked under `lax.scan` (GPU and TPU; int8
slices and their scales scanned together), per layer through XLA's dot, per layer as int8 panels in the native
CPU matmul, and per layer with the inputs as int16 digits through XLA's int8 dot; the Gemma 3 checkpoint adds
alternating sliding layers."""

import numpy as np
import pytest

import jaxpaged.runner.startup as startup_module
from jaxpaged.config import EngineConfig
from jaxpaged.core.scheduler_output import SchedulerOutput
from jaxpaged.runner import int8_probe
from jaxpaged.runner.model_runner import ModelRunner
from tests.runner.test_layer_arrangements import gemma3_dir  # noqa: F401  (a fixture)
from tests.runner.test_step_preparation import _scheduled


def _verdict_for(fastest: str, shapes: int8_probe.ProbeShapes) -> int8_probe.Int8Probe:
    """A probe table in which `fastest` (if a candidate, else XLA's dot) beats the float matmul and the others."""
    fastest = fastest if fastest in shapes.candidates else "xla"
    seconds = {path: (1.0 if path == fastest else 3.0,) for path in shapes.candidates}
    return int8_probe.Int8Probe((16,), {int8_probe.FLOAT: (2.0,), **seconds})


def _int8_runner(model_dir, arrangement: str, monkeypatch) -> ModelRunner:
    from jaxpaged.weights.loader import load_model

    # "packed" and "digits": the CPU's two native int8 matmuls, whichever this CPU would pick.

    config = EngineConfig.from_options(block_size=4, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=16,
                                       max_num_seqs=4, dtype="float32", attention_backend="xla",
                                       disable_hybrid_kv_cache_manager=True, quantization="int8",
                                       cpu_matmul="xla" if arrangement == "unpacked" else "native")
    with monkeypatch.context() as patches:
        patches.setattr(startup_module, "unroll_layers_on", lambda platform: arrangement != "stacked")
        # The start-up probe's verdict, forced: digits, or the panels (the fastest where they run, else XLA's dot).
        forced = "int16 digits" if arrangement == "digits" else "panels"
        patches.setattr(int8_probe, "probe_int8_matmul", lambda shapes: _verdict_for(forced, shapes))
        return ModelRunner(load_model(str(model_dir)), config)


@pytest.mark.parametrize("model", ["llama", "gemma3"])
def test_int8_arrangements_give_the_same_logits(model, tiny_model_dir, gemma3_dir, monkeypatch):  # noqa: F811
    model_dir = {"llama": tiny_model_dir, "gemma3": gemma3_dir}[model]
    runners = {name: _int8_runner(model_dir, name, monkeypatch)
               for name in ("stacked", "unpacked", "packed", "digits")}
    assert {name: runner.plan.int8_matmul for name, runner in runners.items()} == {
        "stacked": "xla", "unpacked": "xla", "packed": "panels", "digits": "int16 digits"}
    packed_layer = runners["packed"].state["layers"]["layers"][0]
    assert packed_layer["q_proj"].ndim == 3 and str(packed_layer["q_proj"].dtype) == "int8"
    assert str(runners["stacked"].state["layers"]["q_proj"].dtype) == "int8"
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    steps = [[_scheduled(prompt[:9], 0, [1, 2, 3], sample=False), _scheduled([31, 32, 33], 0, [5], sample=True)],
             [_scheduled(prompt[9:], 9, [1, 2, 3], sample=True), _scheduled([34], 3, [5], sample=True)]]
    for scheduled in steps:
        output = SchedulerOutput(scheduled, sum(len(s.token_ids) for s in scheduled), set(), set())
        num_sampled = sum(1 for item in scheduled if item.sample)  # the padding rows' logits are unspecified
        logits = {name: np.asarray(runner.compute_logits(*runner.prepare(output)))[:num_sampled]
                  for name, runner in runners.items()}
        assert np.abs(logits["packed"]).max() > 0
        np.testing.assert_allclose(logits["stacked"], logits["packed"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(logits["unpacked"], logits["packed"], rtol=1e-5, atol=1e-5)
        # The digits round each input row to 1 part in 65,278 of its largest value (int16_activations.py).
        np.testing.assert_allclose(logits["digits"], logits["packed"], rtol=1e-4, atol=1e-4)

"""The engine with quantization="w8a8" on the native VNNI matmul against the same engine on XLA's int8 dot: both
quantize each row alike and sum int8 x int8 exactly in int32, so their greedy tokens are identical; the VNNI plan
stores the projections packed for the kernel and names it. Weight-only int8 with its inputs as two int8 digits on
the VNNI matmul gives the XLA digits path's greedy tokens too."""

import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.vnni_matmul import vnni_available, vnni_packed_shape
from jaxpaged.runner import int8_probe
from jaxpaged.runner.startup import StartupPlan
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA

pytestmark = pytest.mark.skipif(not vnni_available(), reason="this CPU has no VPDPBUSD (AVX-512 VNNI / AVX-VNNI)")

_PROMPTS = ["The capital of France is", "Paged attention keeps", "1, 2, 3,", "Once upon a time there was a"]


def _forced(path: str, shapes: int8_probe.ProbeShapes) -> int8_probe.Int8Probe:
    """A probe verdict in which `path` is the fastest w8a8 matmul."""
    seconds = {name: (1.0 if name == path else 3.0,) for name in shapes.candidates}
    return int8_probe.Int8Probe((16,), {int8_probe.FLOAT: (2.0,), **seconds})


def _greedy_tokens(model_dir, path: str, monkeypatch, scheme: str = "w8a8",
                   ) -> tuple[list[list[int]], StartupPlan, dict]:
    """Greedy tokens of the prompts with `scheme` on `path`, the plan, and the first layer's stored weights."""
    from jaxpaged.llm import LLM

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    with monkeypatch.context() as patches:
        patches.setattr(int8_probe, "probe_int8_matmul", lambda shapes: _forced(path, shapes))
        options = TINY_ENGINE_OPTIONS | dict(max_num_seqs=4, max_num_batched_tokens=16)  # fewer step buckets
        with LLM(str(model_dir), quantization=scheme, **options) as llm:
            runner = llm.engine.runner
            tokens = [list(out.outputs[0].token_ids) for out in llm.generate(_PROMPTS, params)]
            return tokens, runner.plan, runner.state["layers"]["layers"][0]


def test_vnni_w8a8_generates_xlas_w8a8_greedy_tokens(tiny_model_dir, monkeypatch):
    vnni_tokens, plan, layer = _greedy_tokens(tiny_model_dir, "vnni w8a8", monkeypatch)
    assert plan.int8_matmul == "vnni w8a8"
    assert "w8a8 projections: native VNNI int8 x int8 (VPDPBUSD)" in plan.describe()
    hidden = TINY_LLAMA["hidden_size"]
    assert tuple(layer["q_proj"].shape) == vnni_packed_shape(hidden, hidden)
    assert str(layer["q_proj"].dtype) == "int8"
    xla_tokens, xla_plan, _ = _greedy_tokens(tiny_model_dir, "w8a8", monkeypatch)
    assert xla_plan.int8_matmul == "w8a8"
    assert all(len(tokens) == 16 for tokens in vnni_tokens)
    assert vnni_tokens == xla_tokens
    assert len({tuple(tokens) for tokens in vnni_tokens}) > 1  # the prompts do lead somewhere different
    assert np.all(np.asarray(vnni_tokens) < TINY_LLAMA["vocab_size"])


def test_int16_digits_on_vnni_generate_the_xla_digits_greedy_tokens(tiny_model_dir, monkeypatch):
    vnni_tokens, plan, layer = _greedy_tokens(tiny_model_dir, "vnni digits", monkeypatch, scheme="int8")
    assert plan.int8_matmul == "vnni digits" and "int8 projections: native VNNI" in plan.describe()
    assert tuple(layer["gate_proj"].shape) == vnni_packed_shape(TINY_LLAMA["hidden_size"],
                                                               TINY_LLAMA["intermediate_size"])
    xla_tokens, xla_plan, _ = _greedy_tokens(tiny_model_dir, "int16 digits", monkeypatch, scheme="int8")
    assert xla_plan.int8_matmul == "int16 digits"
    assert vnni_tokens == xla_tokens and all(len(tokens) == 16 for tokens in vnni_tokens)

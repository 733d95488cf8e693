"""The engine with weight-only int8 on the native bfloat16-dot matmul ("bf16 panels") against the same engine on the
float32-input int8 panels: the same quantized weights, the inputs of each projection rounded to bfloat16 in the
first, so the greedy tokens are the panels' ones; the plan stores the projections in pair order and names the kernel."""

import numpy as np
import pytest

from jaxpaged.kernels.cpu_native.int8_bf16_matmul import int8_bf16_available, pack_int8_pairs, unpack_int8_pairs
from jaxpaged.kernels.cpu_native.packed_matmul import packed_int8_available, unpack_panels
from jaxpaged.runner import int8_probe
from jaxpaged.runner.startup import StartupPlan
from jaxpaged.sampling.params import SamplingParams
from tests.conftest import TINY_ENGINE_OPTIONS, TINY_LLAMA

pytestmark = pytest.mark.skipif(not (int8_bf16_available() and packed_int8_available()),
                                reason="this CPU has no AVX512-BF16, or the native int8 kernel did not build")

_PROMPTS = ["The capital of France is", "Paged attention keeps", "1, 2, 3,", "Once upon a time there was a"]


def _forced(path: str, shapes: int8_probe.ProbeShapes) -> int8_probe.Int8Probe:
    """A probe verdict in which `path` is the fastest weight-only int8 matmul."""
    seconds = {name: (1.0 if name == path else 3.0,) for name in shapes.candidates}
    return int8_probe.Int8Probe((16,), {int8_probe.FLOAT: (2.0,), **seconds})


def _greedy_tokens(model_dir, path: str, monkeypatch) -> tuple[list[list[int]], StartupPlan, np.ndarray]:
    """Greedy tokens of the prompts with weight-only int8 on `path`, the plan, and the first layer's stored q_proj."""
    from jaxpaged.llm import LLM

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    with monkeypatch.context() as patches:
        patches.setattr(int8_probe, "probe_int8_matmul", lambda shapes: _forced(path, shapes))
        options = TINY_ENGINE_OPTIONS | dict(max_num_seqs=4, max_num_batched_tokens=16)  # fewer step buckets
        with LLM(str(model_dir), quantization="int8", **options) as llm:
            runner = llm.engine.runner
            tokens = [list(out.outputs[0].token_ids) for out in llm.generate(_PROMPTS, params)]
            return tokens, runner.plan, np.asarray(runner.state["layers"]["layers"][0]["q_proj"])


def test_bf16_panels_generate_the_int8_panels_greedy_tokens(tiny_model_dir, monkeypatch):
    """Same quantized weights, packed in each kernel's order; greedy tokens equal the float32-input panels'."""
    ours, plan, q_pairs = _greedy_tokens(tiny_model_dir, "bf16 panels", monkeypatch)
    assert plan.int8_matmul == "bf16 panels" and plan.packed_int8
    assert "int8 projections: native bfloat16 pair dot (VDPBF16PS)" in plan.describe()
    hidden = TINY_LLAMA["hidden_size"]
    assert q_pairs.shape == (hidden // 16, hidden, 16) and q_pairs.dtype == np.int8
    theirs, panels_plan, q_panels = _greedy_tokens(tiny_model_dir, "panels", monkeypatch)
    assert panels_plan.int8_matmul == "panels"
    # The same int8 values, each in its kernel's order.
    np.testing.assert_array_equal(q_pairs, pack_int8_pairs(unpack_panels(q_panels)))
    np.testing.assert_array_equal(unpack_int8_pairs(q_pairs, hidden), unpack_panels(q_panels))
    assert all(len(tokens) == 16 for tokens in ours)
    assert len({tuple(tokens) for tokens in ours}) > 1  # the prompts do lead somewhere different
    assert ours == theirs

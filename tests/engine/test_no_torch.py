"""torch is for tests and peer benchmarks only: loading a model and running the engine never imports it."""

import subprocess
import sys

SCRIPT = """
import sys
from jaxpaged.config import EngineConfig
from jaxpaged.engine import LLMEngine
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
engine = LLMEngine(load_model(sys.argv[1]), EngineConfig.from_options(max_model_len=64, max_num_seqs=4,
                   max_num_batched_tokens=16, num_kv_blocks=16, compilation_cache_dir=""), warmup=False)
engine.add_request("r", "Hello", SamplingParams(max_tokens=2))
while engine.has_unfinished_requests():
    engine.step()
print("torch" in sys.modules, "transformers.modeling_utils" in sys.modules)
"""


def test_engine_runs_without_importing_torch(tiny_model_dir):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]

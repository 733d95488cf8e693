"""lm-evaluation-harness's `local-completions` model (echo + logprobs loglikelihoods against our server) scores a
small local multiple-choice task exactly as its `hf` backend does on the same weights (no network)."""

import os
import pathlib
from typing import Any

import pytest

from benchmarks.quantization.mc_task import write_mc_task
from tests.conftest import TINY_ENGINE_OPTIONS

pytestmark = pytest.mark.xdist_group("lm_eval")

QUESTIONS = [
    ("The capital of France is", [" Paris", " Rome", " Madrid", " Berlin"], 0),
    ("Two plus two equals", [" four", " five", " three", " seven"], 0),
    ("The colour of the sky is", [" green", " blue", " red", " purple"], 1),
    ("Water freezes at zero degrees", [" Kelvin", " Fahrenheit", " Celsius", " Rankine"], 2),
    ("A week has seven", [" years", " hours", " months", " days"], 3),
    ("The opposite of hot is", [" cold", " warm", " spicy", " loud"], 0),
    ("Cats like to chase", [" cars", " mice", " clouds", " numbers"], 1),
    ("The sun rises in the", [" west", " north", " east", " south"], 2),
]


def write_task(directory: pathlib.Path) -> None:
    write_mc_task(directory, "jaxpaged_mc", [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS],
                  ("acc",))


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    from jaxpaged.async_engine import AsyncLLMEngine
    from jaxpaged.engine import LLMEngine
    from jaxpaged.server import ServerSettings, build_app
    from tests.server.server_helpers import ServerThread

    engine = AsyncLLMEngine(LLMEngine.from_options(str(tiny_model_dir), **TINY_ENGINE_OPTIONS))
    engine.start()
    try:
        with ServerThread(build_app(engine, ServerSettings())) as running:
            yield running, engine.model_name
    finally:
        engine.shutdown()


def test_local_completions_accuracy_equals_the_hf_backend(tiny_server, tiny_model_dir, tmp_path, monkeypatch):
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    write_task(tmp_path)
    # include_defaults=False: the task needs none of lm-eval's own, and indexing them costs 7.5 s of CPU.
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)
    server, model_name = tiny_server
    served: Any = simple_evaluate(
        model="local-completions", tasks=["jaxpaged_mc"], task_manager=tasks,
        model_args=f"base_url={server.base_url}/v1/completions,model={model_name},tokenizer={tiny_model_dir},"
                   "num_concurrent=1,max_retries=1,tokenized_requests=True", log_samples=True)
    reference: Any = simple_evaluate(
        model="hf", tasks=["jaxpaged_mc"], task_manager=tasks, log_samples=True,
        model_args=f"pretrained={tiny_model_dir},dtype=float32,device=cpu")
    assert served is not None and reference is not None
    got = served["results"]["jaxpaged_mc"]["acc,none"]
    want = reference["results"]["jaxpaged_mc"]["acc,none"]
    assert got == want
    # Not only the score: every choice's loglikelihood agrees with HF's within float32 noise.
    ours = [float(r[0]) for s in served["samples"]["jaxpaged_mc"] for r in s["filtered_resps"]]
    theirs = [float(r[0]) for s in reference["samples"]["jaxpaged_mc"] for r in s["filtered_resps"]]
    assert len(ours) == len(theirs) == 4 * len(QUESTIONS)
    assert ours == pytest.approx(theirs, abs=2e-3)
    assert os.environ["HF_HUB_OFFLINE"] == "1"

"""The host-path benchmark's cases: a real LLMEngine over a stub device, run to a steady batch, each host phase
recorded per step (offline through LLMEngine.step, or the server's way through AsyncLLMEngine and asyncio readers).

The model is a random one-layer Llama (hidden 64) with SmolLM2's 49,152-token vocabulary and tokenizer: the
detokenizer and the grammars do real work; what the model computes does not matter, the stub device samples.
"""

import asyncio
import dataclasses
import gc
import statistics
import time
from typing import Optional

import numpy as np

from benchmarks.host_path.stub_device import StubDevice
from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.config import EngineConfig
from jaxpaged.engine import LLMEngine
from jaxpaged.engine.step_timings import StepTimings
from jaxpaged.models.param_shapes import param_shapes
from jaxpaged.models.registry import read_model_config
from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams
from jaxpaged.weights.loader import LoadedModel, locate_model

PHASES = ("schedule_s", "prepare_s", "launch_s", "readback_s", "scheduler_update_s", "process_s")
"""The host phases, in step order; process_s includes scheduler_update_s (shown apart as its share)."""

TINY_HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                  "max_position_embeddings": 4096, "tie_word_embeddings": True, "eos_token_id": 2}

ORDER_SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "quantity": {"type": "integer"}}, "required": ["name", "quantity"]}},
    "note": {"type": "string", "minLength": 4000}}, "required": ["items", "note"]}
"""A schema a constrained request decodes under for the whole measurement: the stub device picks an allowed token
at random, which may close the array at any time, but the note cannot close before 4,000 characters."""


def tiny_model() -> LoadedModel:
    """A random one-layer Llama with the embedded model's tokenizer: real detokenization, a cheap device step."""
    tokenizer_dir = locate_model(None)[0]
    config = read_model_config(TINY_HF_CONFIG)
    rng = np.random.default_rng(0)
    params = {name: (rng.standard_normal(shape) * 0.5).astype(np.float32)
              for name, shape in param_shapes(config).items()}
    return LoadedModel("tiny-host-path", TINY_HF_CONFIG, config, params, tokenizer_dir)


@dataclasses.dataclass
class Case:
    num_requests: int
    async_scheduling: bool
    json_schema_fraction: float = 0.0
    n: int = 1
    prefill_chunk: int = 0
    """Tokens of one long prompt admitted beside the decodes (0: a pure decode batch)."""
    logprobs: Optional[int] = None
    final_only: bool = True
    """Offline callers ask for finished outputs only; a server streams (False: an output per request per step)."""

    @property
    def label(self) -> str:
        """E.g. "sync 256", "async 256 json 0.1", "sync 256 n=2 stream"."""
        return (f"{'async' if self.async_scheduling else 'sync'} {self.num_requests}"
                + (f" json {self.json_schema_fraction:g}" if self.json_schema_fraction else "")
                + (f" n={self.n}" if self.n > 1 else "")
                + (f" chunk {self.prefill_chunk}" if self.prefill_chunk else "")
                + (f" logprobs {self.logprobs}" if self.logprobs is not None else "")
                + ("" if self.final_only else " stream"))


LONG_PROMPT_CHUNKS = 4
"""The mixed case's long prompts take this many steps' chunks each."""


def build_engine(model: LoadedModel, case: Case, num_steps: int, max_model_len: int) -> LLMEngine:
    rows = case.num_requests * case.n + (num_long_prompts(case, num_steps) if case.prefill_chunk else 0)
    config = EngineConfig.from_options(
        # Room for prefill beside a full decode batch: with a budget of exactly one token per row, the last
        # prompts would prefill a few tokens a step while the first requests decode to their end.
        max_num_seqs=rows, max_num_batched_tokens=rows + max(case.prefill_chunk, 512),
        max_model_len=max(max_model_len, LONG_PROMPT_CHUNKS * case.prefill_chunk + 1), block_size=16,
        num_kv_blocks=rows * 16 + (num_steps + 4) * case.prefill_chunk // 16 + 64,
        async_scheduling=case.async_scheduling, dtype="float32", enable_prefix_caching=True)
    return LLMEngine(model, config, warmup=False)  # the stub device compiles its own programs, cheaply


def num_long_prompts(case: Case, num_steps: int) -> int:
    return num_steps // LONG_PROMPT_CHUNKS + 1 if case.prefill_chunk else 0


def run_case(model: LoadedModel, case: Case, num_steps: int, device_step_s: float,
             max_model_len: int) -> dict[str, list[float]]:
    """Per-step seconds of each phase over num_steps steady decode steps (after every prompt is in)."""
    engine = build_engine(model, case, num_steps, max_model_len)
    stub = StubDevice(engine.runner, device_step_s)
    try:
        return _measure(engine, case, num_steps)
    finally:
        stub.restore()


def requests_of(case: Case, num_steps: int) -> list[tuple[str, dict, SamplingParams]]:
    """(request id, prompt, params) of the case's decoding requests."""
    rng = np.random.default_rng(1)
    constrained = int(round(case.num_requests * case.json_schema_fraction))
    requests = []
    for index in range(case.num_requests):
        structured = StructuredOutputsParams(json=ORDER_SCHEMA) if index < constrained else None
        params = SamplingParams(max_tokens=num_steps * 3, ignore_eos=True, temperature=0.0 if case.n == 1 else 1.0,
                                n=case.n, seed=index, logprobs=case.logprobs, structured_outputs=structured)
        prompt = rng.integers(100, 40000, size=int(rng.integers(16, 48))).tolist()
        requests.append((f"request-{index}", {"prompt_token_ids": prompt}, params))
    return requests


def _measure(engine: LLMEngine, case: Case, num_steps: int) -> dict[str, list[float]]:
    if not case.final_only:
        return _measure_streaming(engine, case, num_steps)
    rng = np.random.default_rng(2)
    for request_id, prompt, params in requests_of(case, num_steps):
        engine.add_request(request_id, prompt, params)
    while engine.scheduler.num_waiting or any(r.num_computed_tokens < r.num_tokens - 1
                                              for r in engine.scheduler.running):
        engine.step(final_only=case.final_only)
    for _ in range(4):  # the held-back samples of n > 1 and the loop's first plan-ahead settle
        engine.step(final_only=case.final_only)
    for index in range(num_long_prompts(case, num_steps)):  # one after the other, a chunk beside every decode step
        long_prompt = rng.integers(100, 40000, size=LONG_PROMPT_CHUNKS * case.prefill_chunk).tolist()
        engine.add_request(f"long-{index}", {"prompt_token_ids": long_prompt}, SamplingParams(max_tokens=1))
    samples: dict[str, list[float]] = {name: [] for name in SAMPLE_NAMES if name != "deliver_s"}
    gc.collect()
    for _ in range(num_steps):
        engine.step(final_only=case.final_only)
        record(engine.timings, samples)
    decoding = sum(1 for request in engine.scheduler.running if not request.request_id.startswith("long-"))
    if decoding != case.num_requests * case.n:  # a request finished: the batch is not what the case says
        raise RuntimeError(f"{decoding} requests decode at the end, not {case.num_requests * case.n}")
    engine.abort_request(list(engine.requests.groups))
    return samples


class _StepRecorder:
    """An engine observer keeping every step's timings, and the time the server's loop then spent handing the
    step's outputs to their streams (AsyncLLMEngine._dispatch, wrapped), as "deliver_s"."""

    def __init__(self, async_engine: AsyncLLMEngine) -> None:
        self.samples: dict[str, list[float]] = {name: [] for name in SAMPLE_NAMES}
        self.steady = False
        """Set once every request decodes: steps before are not kept."""
        dispatch = async_engine._dispatch

        def timed_dispatch(outputs):
            start = time.perf_counter()
            dispatch(outputs)
            if self.steady and len(self.samples["deliver_s"]) < len(self.samples["host_s"]):
                self.samples["deliver_s"].append(time.perf_counter() - start)

        async_engine._dispatch = timed_dispatch

    def after_schedule(self, scheduler) -> None:
        pass

    def after_step(self, outputs, timings: StepTimings) -> None:
        if self.steady:
            record(timings, self.samples)


def _measure_streaming(engine: LLMEngine, case: Case, num_steps: int) -> dict[str, list[float]]:
    """The server's way: an AsyncLLMEngine's loop thread steps the engine and hands every step's outputs to the
    requests' streams, which asyncio readers on this thread consume (what the HTTP handlers do, less the HTTP)."""
    async_engine = AsyncLLMEngine(engine)
    recorder = _StepRecorder(async_engine)
    engine.observers.append(recorder)
    async_engine.start()

    async def read(stream, counts: list[int]) -> None:
        async for output in stream:
            counts[0] = max(counts[0], len(output.outputs[0].token_ids))

    async def run() -> None:
        counts = [[0] for _ in range(case.num_requests)]
        streams = [async_engine.add_request(request_id, prompt, params)
                   for request_id, prompt, params in requests_of(case, num_steps)]
        readers = [asyncio.ensure_future(read(stream, count)) for stream, count in zip(streams, counts)]
        while min(count[0] for count in counts) < 4:  # every prompt is in and decoding
            await asyncio.sleep(0.005)
        recorder.steady = True
        while len(recorder.samples["deliver_s"]) < num_steps:
            await asyncio.sleep(0.005)
        recorder.steady = False
        for stream, reader in zip(streams, readers):
            stream.close()  # aborts the request; its reader waits for an output that will not come
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    try:
        asyncio.run(run())
    finally:
        async_engine.shutdown()
    samples = {name: values[:num_steps] for name, values in recorder.samples.items()}
    # Handing outputs over is host work of the step too (on the loop thread, after LLMEngine.step returns).
    deliver = samples["deliver_s"]
    samples["host_s"] = [host + d for host, d in zip(samples["host_s"], deliver)]
    samples["exposed_s"] = [exposed + d if exposed else 0.0 for exposed, d in zip(samples["exposed_s"], deliver)]
    return samples


SAMPLE_NAMES = (*PHASES, "device_wait_s", "host_s", "exposed_s", "step_s", "deliver_s")


def record(timings: StepTimings, samples: dict[str, list[float]]) -> None:
    for name in PHASES:
        samples[name].append(getattr(timings, name))
    samples["device_wait_s"].append(timings.device_wait_s)
    samples["host_s"].append(timings.host_s)
    samples["exposed_s"].append(0.0 if timings.hidden else timings.host_s)
    samples["step_s"].append(timings.step_s)


def summarize(samples: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
    """(median, p90) in milliseconds per phase."""
    return {name: (statistics.median(values) * 1e3, float(np.percentile(values, 90)) * 1e3)
            for name, values in samples.items() if values}

"""llama.cpp through llama-cpp-python, when it is installed (it is not a dependency; nothing installs it).

The high-level Llama object serves one sequence at a time, so requests run one after the other, streamed for
token times; EOS is masked by a logits processor when the workload ignores it. Without the package the peer
raises PeerUnavailable and the results say "not installed".
"""

import importlib.util
import math
import time
from typing import Optional

from jaxpaged.bench.bench_config import SamplingConfig
from jaxpaged.bench.latency_stats import RequestTiming, run_metrics
from jaxpaged.bench.peers import PeerUnavailable
from jaxpaged.bench.peers.hf_model import gguf_path
from jaxpaged.bench.workloads import BenchRequest, group_by_turn


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppPeer:
    """A llama_cpp.Llama on the model's GGUF."""

    def __init__(self, model: Optional[str], options: dict):
        if not llama_cpp_available():
            raise PeerUnavailable("llama-cpp-python is not installed")
        # optional package, not installed here: pyright resolves the name to this very module (same file name)
        from llama_cpp import Llama  # pyright: ignore[reportAttributeAccessIssue]

        settings = {"n_ctx": 2048, "n_batch": 512, "verbose": False, **options}
        self.llm = Llama(model_path=str(gguf_path(model)), **settings)
        self.eos_token_id = self.llm.token_eos()


def _run_request(peer: LlamaCppPeer, request: BenchRequest, sampling: SamplingConfig, arrival: float,
                 timings: list[RequestTiming]) -> None:
    from llama_cpp import LogitsProcessorList  # pyright: ignore[reportAttributeAccessIssue]  (as in __init__)

    def mask_eos(input_ids, scores):
        scores[peer.eos_token_id] = -math.inf
        return scores

    processors = LogitsProcessorList([mask_eos]) if sampling.ignore_eos else None
    greedy = sampling.temperature == 0
    token_times = []
    num_tokens = 0
    for _chunk in peer.llm.create_completion(
            prompt=list(request.prompt_token_ids), max_tokens=request.max_tokens, stream=True,
            temperature=sampling.temperature, top_k=1 if greedy else 0, top_p=1.0, logits_processor=processors):
        token_times.append(time.time())
        num_tokens += 1
    if not token_times:
        return
    timings.append(RequestTiming(arrival, token_times[0], token_times[-1], len(request.prompt_token_ids),
                                 num_tokens, token_times))


def run_llama_cpp(peer: LlamaCppPeer, requests: list[BenchRequest], sampling: SamplingConfig) -> dict:
    """One measured run, requests one at a time; a round's requests all arrive when the round starts."""
    timings: list[RequestTiming] = []
    start = time.time()
    for round_indices in group_by_turn(requests):
        arrival = time.time()
        for index in round_indices:
            _run_request(peer, requests[index], sampling, arrival, timings)
    return run_metrics(timings, time.time() - start)

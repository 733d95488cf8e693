"""HF transformers continuous batching: model.generate_batch (transformers 5.x) over the whole round.

generate_batch takes one max_new_tokens for all requests, so it gets the round's largest max_tokens and each
request's useful tokens are its own max_tokens (the same accounting as static batching). Its per-token
timestamps (record_timestamps=True, perf_counter clock) give TTFT and ITL. A failure is raised as the peer's
result, never hidden.
"""

import time

from jaxpaged.bench.bench_config import SamplingConfig
from jaxpaged.bench.latency_stats import RequestTiming, run_metrics
from jaxpaged.bench.peers import PeerFailure
from jaxpaged.bench.peers.hf_model import HFPeerModel
from jaxpaged.bench.workloads import BenchRequest, group_by_turn


def _generation_config(peer: HFPeerModel, sampling: SamplingConfig, max_new_tokens: int):
    from transformers import GenerationConfig

    options = {"max_new_tokens": max_new_tokens, "pad_token_id": peer.pad_token_id,
               # generate_batch disables the EOS stop when eos_token_id is unset: exactly max_new_tokens each.
               "eos_token_id": None if sampling.ignore_eos else peer.eos_token_id}
    if sampling.temperature > 0:
        options.update(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0)
    else:
        options["do_sample"] = False
    return GenerationConfig(**options)


def _run_round(peer: HFPeerModel, batch: list[BenchRequest], sampling: SamplingConfig,
               timings: list[RequestTiming]) -> None:
    import torch

    max_new_tokens = max(r.max_tokens for r in batch)
    arrival = time.time()
    clock_offset = arrival - time.perf_counter()  # generate_batch stamps tokens with perf_counter
    with torch.inference_mode():
        results = peer.model.generate_batch([list(r.prompt_token_ids) for r in batch],
                                            generation_config=_generation_config(peer, sampling, max_new_tokens),
                                            record_timestamps=True, progress_bar=False)
    outputs = list(results.values())
    if len(outputs) != len(batch):
        raise PeerFailure(f"generate_batch returned {len(outputs)} results for {len(batch)} requests")
    for request, output in zip(batch, outputs):
        if output.error is not None:
            raise PeerFailure(f"generate_batch request {output.request_id} failed: {output.error}")
        tokens = list(output.generated_tokens)
        num_tokens = min(request.max_tokens, len(tokens))
        if not sampling.ignore_eos and peer.eos_token_id in tokens[:num_tokens]:
            num_tokens = tokens.index(peer.eos_token_id) + 1
        if num_tokens == 0 or not output.timestamps:
            raise PeerFailure(f"generate_batch request {output.request_id} produced no timed tokens")
        token_times = [t + clock_offset for t in output.timestamps[:num_tokens]]
        timings.append(RequestTiming(arrival, token_times[0], token_times[-1], len(request.prompt_token_ids),
                                     num_tokens, token_times))


def run_hf_continuous(peer: HFPeerModel, requests: list[BenchRequest], sampling: SamplingConfig) -> dict:
    """One measured run: one generate_batch call per round."""
    timings: list[RequestTiming] = []
    start = time.time()
    for round_indices in group_by_turn(requests):
        _run_round(peer, [requests[i] for i in round_indices], sampling, timings)
    return run_metrics(timings, time.time() - start)


def warm_up_hf_continuous(peer: HFPeerModel, requests: list[BenchRequest], sampling: SamplingConfig) -> None:
    """Two short requests through generate_batch, unmeasured."""
    _run_round(peer, [BenchRequest(r.prompt_token_ids, 2) for r in requests[:2]], sampling, [])

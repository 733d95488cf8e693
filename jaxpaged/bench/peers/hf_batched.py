"""HF transformers static batching: model.generate over left-padded batches of batch_size prompts, in order.

A batch runs until its longest request is done (max_new_tokens = the batch's largest max_tokens, and
min_new_tokens the same when EOS is ignored), so a request's useful tokens are its own max_tokens; the rest is
the padding cost of static batching. Token times come from a logits processor that notes when each step's
logits are ready, which is when that step's token is chosen.
"""

import time

from jaxpaged.bench.bench_config import SamplingConfig
from jaxpaged.bench.latency_stats import RequestTiming, run_metrics
from jaxpaged.bench.peers.hf_model import HFPeerModel
from jaxpaged.bench.workloads import BenchRequest, group_by_turn


class _StepClock:
    """A logits processor that only records the wall time of every decoding step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.time())
        return scores


def _generation_kwargs(peer: HFPeerModel, sampling: SamplingConfig, max_new_tokens: int) -> dict:
    kwargs = {"max_new_tokens": max_new_tokens, "pad_token_id": peer.pad_token_id}
    if sampling.ignore_eos:
        kwargs["min_new_tokens"] = max_new_tokens
    if sampling.temperature > 0:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=0, top_p=1.0)
    else:
        kwargs["do_sample"] = False
    return kwargs


def left_pad(prompts: list[tuple[int, ...]], pad_token_id: int):
    """(input_ids, attention_mask) int64 tensors, prompts right-aligned as decoder-only generation needs."""
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt):] = 1
    return input_ids, attention_mask


def _num_useful_tokens(new_tokens: list[int], max_tokens: int, sampling: SamplingConfig, eos_token_id) -> int:
    if not sampling.ignore_eos and eos_token_id in new_tokens[:max_tokens]:
        return new_tokens.index(eos_token_id) + 1
    return min(max_tokens, len(new_tokens))


def _run_batch(peer: HFPeerModel, batch: list[BenchRequest], sampling: SamplingConfig, arrival: float,
               timings: list[RequestTiming]) -> None:
    import torch
    from transformers import LogitsProcessorList

    input_ids, attention_mask = left_pad([r.prompt_token_ids for r in batch], peer.pad_token_id)
    clock = _StepClock()
    with torch.inference_mode():
        # transformers' stub: its own GenerativePreTrainedModel protocol rejects what from_pretrained returns
        sequences = peer.model.generate(  # pyright: ignore[reportAttributeAccessIssue]
            input_ids=input_ids, attention_mask=attention_mask, logits_processor=LogitsProcessorList([clock]),
            **_generation_kwargs(peer, sampling, max(r.max_tokens for r in batch)))
    new_tokens = sequences[:, input_ids.shape[1]:].tolist()
    for row, request in enumerate(batch):
        num_tokens = _num_useful_tokens(new_tokens[row], request.max_tokens, sampling, peer.eos_token_id)
        token_times = clock.times[:num_tokens]
        timings.append(RequestTiming(arrival, token_times[0], token_times[-1], len(request.prompt_token_ids),
                                     num_tokens, token_times))


def run_hf_batched(peer: HFPeerModel, requests: list[BenchRequest], sampling: SamplingConfig,
                   batch_size: int) -> dict:
    """One measured run; every request of a round arrives when the round starts."""
    timings: list[RequestTiming] = []
    start = time.time()
    for round_indices in group_by_turn(requests):
        arrival = time.time()
        for first in range(0, len(round_indices), batch_size):
            batch = [requests[i] for i in round_indices[first:first + batch_size]]
            _run_batch(peer, batch, sampling, arrival, timings)
    return run_metrics(timings, time.time() - start)


def warm_up_hf_batched(peer: HFPeerModel, requests: list[BenchRequest], sampling: SamplingConfig) -> None:
    """Two short requests, so the first measured batch does not pay torch's one-time set-up."""
    batch = [BenchRequest(r.prompt_token_ids, 2) for r in requests[:2]]
    _run_batch(peer, batch, sampling, time.time(), [])

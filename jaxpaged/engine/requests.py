"""A user's request and its n samples.

Vocabulary: the scheduler's `core.request.Request` is one *sample* (one sequence with its own KV blocks); a
`RequestGroup` is what the user sent: a prompt, its SamplingParams and n samples, each with its own
detokenizer and logprobs. With n = 1 the group holds one sample whose id is the request id.
"""

import dataclasses
import random
from typing import Optional, Union

from jaxpaged.core.request import Request
from jaxpaged.engine.detokenizer import IncrementalDetokenizer
from jaxpaged.inputs import ParsedPrompt
from jaxpaged.lora.request import LoRARequest
from jaxpaged.outputs import CompletionOutput, FinishReason, Logprob, RequestMetrics, RequestOutput, TokenLogprobs
from jaxpaged.sampling.params import SamplingParams


@dataclasses.dataclass
class Sample:
    """One of a request's n samples: a scheduler Request plus what the engine tracks for it."""

    index: int
    request: Request
    detokenizer: IncrementalDetokenizer
    logprobs: Optional[list[TokenLogprobs]] = None
    cumulative_logprob: Optional[float] = None
    finish_reason: Optional[FinishReason] = None
    stop_reason: Union[int, str, None] = None


class RequestGroup:
    """A request as the user sees it. With n > 1, samples after the first wait until the first has computed
    the prompt, so they find its blocks in the prefix cache instead of prefilling n times."""

    def __init__(self, request_id: str, prompt: ParsedPrompt, params: SamplingParams, samples: list[Sample],
                 arrival_time: float):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.samples = samples
        self.num_released = 1
        """Samples handed to the scheduler so far; the rest are held back."""
        self.prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
        if params.prompt_logprobs is not None:
            self.prompt_logprobs = [None for _ in prompt.token_ids]
        """Filled position by position as the first sample's prefill scores the prompt (position 0 stays None)."""
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.has_first_token = False
        """A flag on the group: reading metrics for every token would touch one more object per step."""

    def held_back(self) -> list[Sample]:
        """Samples still waiting for the first one's prefill."""
        return self.samples[self.num_released:]

    def ready_to_release(self) -> bool:
        """The first sample's prompt KV is computed (or it ended), so its full blocks are hittable now."""
        first = self.samples[0]
        # Its first token is applied once the step that finished its prompt is: counting computed tokens would
        # also be true while that step is still in flight (async scheduling), before its blocks are hashed.
        return first.finish_reason is not None or first.request.num_output_tokens > 0

    def finished(self) -> bool:
        return all(sample.finish_reason is not None for sample in self.samples)

    def num_output_tokens(self) -> int:
        """Tokens generated so far by all samples."""
        return sum(len(sample.request.output_token_ids) for sample in self.samples)

    def to_output(self) -> RequestOutput:
        """The cumulative RequestOutput of every sample: a snapshot, whose lists the engine never touches again
        (outputs cross to the server's thread while later steps go on)."""
        completions = [
            CompletionOutput(index=s.index, text=s.detokenizer.output_text,
                             token_ids=list(s.request.output_token_ids), cumulative_logprob=s.cumulative_logprob,
                             logprobs=None if s.logprobs is None else list(s.logprobs),
                             finish_reason=s.finish_reason, stop_reason=s.stop_reason)
            for s in self.samples]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt.text,
                             prompt_token_ids=self.prompt.token_ids,
                             num_cached_tokens=self.samples[0].request.num_cached_tokens,
                             outputs=completions, finished=self.finished(), metrics=self.metrics,
                             prompt_logprobs=None if self.prompt_logprobs is None else list(self.prompt_logprobs))


def make_samples(request_id: str, prompt: ParsedPrompt, params: SamplingParams, arrival_time: float, tokenizer,
                 eos_token_ids: list[int], seed_rng: random.Random,
                 lora_request: Optional[LoRARequest] = None, lora_fingerprint: Optional[str] = None,
                 ) -> list[Sample]:
    """The n samples of a request: scheduler Requests with their stop criteria, resolved seeds and LoRA adapter,
    and a detokenizer each. Sample i's id is `request_id#i` when n > 1; its seed the user's + i, or one drawn."""
    samples = []
    for index in range(params.n):
        sample_id = request_id if params.n == 1 else f"{request_id}#{index}"
        seed = seed_rng.getrandbits(63) if params.seed is None else params.seed + index
        request = Request(
            sample_id, prompt.token_ids, max_tokens=params.max_tokens, min_tokens=params.min_tokens,
            eos_token_id=eos_token_ids[0] if eos_token_ids else None,
            stop_token_ids=list(params.stop_token_ids or ()) + eos_token_ids[1:], ignore_eos=params.ignore_eos,
            arrival_time=arrival_time, priority=prompt.priority, cache_salt=prompt.cache_salt,
            sampling_params=params, sampling_seed=seed,
            computes_whole_prompt=params.prompt_logprobs is not None and index == 0,
            lora_id=0 if lora_request is None else lora_request.lora_int_id,
            lora_name=None if lora_request is None else lora_request.lora_name, lora_fingerprint=lora_fingerprint)
        detokenizer = IncrementalDetokenizer(
            tokenizer, prompt.token_ids, skip_special_tokens=params.skip_special_tokens,
            stop=params.stop or (), include_stop_str_in_output=params.include_stop_str_in_output)
        samples.append(Sample(index, request, detokenizer))
    return samples

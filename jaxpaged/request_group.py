"""One user request and its n samples: per-sample detokenizer and logprobs, and the RequestOutput they make."""

import dataclasses
import time
from typing import Optional, Union

from jaxpaged.core.request import Request, RequestStatus
from jaxpaged.detokenizer import IncrementalDetokenizer
from jaxpaged.inputs import ParsedPrompt
from jaxpaged.outputs import CompletionOutput, FinishReason, Logprob, RequestMetrics, RequestOutput, TokenLogprobs
from jaxpaged.sampling_params import SamplingParams

_RUNNING = RequestStatus.RUNNING


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
        self._has_first_token = False

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

    def record_token(self, sample: Sample, token_id: int, top: Optional[list[tuple[int, float]]],
                     sampled_logprob: float, tokenizer, sampled_rank: Optional[int] = None,
                     grammar_complete: bool = False) -> None:
        """Account one sampled token: logprobs (with the sampled token's exact rank), detokenized text, finish
        state. `grammar_complete`: the token completed the sample's structured output (it stops, token kept)."""
        if not self._has_first_token:  # a flag on the group: reading metrics each token would touch one more object
            self._has_first_token = True
            self.metrics.first_token_time = time.time()
        if self.params.logprobs is not None:
            entry = {}
            for rank, (top_id, top_logprob) in enumerate(top or [], start=1):
                entry[top_id] = Logprob(top_logprob, rank, tokenizer.decode([top_id]))
            if token_id not in entry:  # outside the top-k asked for: the sampler counted its exact rank
                rank = sampled_rank if sampled_rank is not None else len(entry) + 1
                entry[token_id] = Logprob(sampled_logprob, rank, tokenizer.decode([token_id]))
            sample.logprobs = (sample.logprobs or []) + [entry]
            sample.cumulative_logprob = (sample.cumulative_logprob or 0.0) + sampled_logprob
        request = sample.request
        detokenizer = sample.detokenizer
        finish_reason = None if request.status is _RUNNING else request.finish_reason
        if finish_reason is None and not grammar_complete:
            detokenizer.append_token(token_id)
            if detokenizer.stop_string is None:
                return  # the common case, kept short: it runs for every running request, every step
        else:
            detokenizer.append_tokens((token_id,), stop_terminated=finish_reason == "stop")
            # Before reading stop_string: text held back behind a partial character is only decided here,
            # and a stop string inside it must still cut the text and name the stop.
            detokenizer.finish()
        if detokenizer.stop_string is not None:
            sample.finish_reason, sample.stop_reason = "stop", detokenizer.stop_string
        elif finish_reason is not None:
            sample.finish_reason, sample.stop_reason = finish_reason, request.stop_reason
        else:
            sample.finish_reason, sample.stop_reason = "stop", None  # its grammar completed
        if self.metrics.finish_time is None and self.finished():
            self.metrics.finish_time = time.time()

    def record_prompt_logprob(self, position: int, logprob: float, rank: int, top: list[tuple[int, float]],
                              tokenizer) -> None:
        """One prompt token's logprob; a recomputed position (after preemption) keeps its first value."""
        if self.prompt_logprobs is None or self.prompt_logprobs[position] is not None:
            return
        token_id = self.prompt.token_ids[position]
        entry = {top_id: Logprob(top_logprob, k, tokenizer.decode([top_id]))
                 for k, (top_id, top_logprob) in enumerate(top[:self.params.prompt_logprobs or 0], start=1)}
        entry[token_id] = Logprob(logprob, rank, tokenizer.decode([token_id]))
        self.prompt_logprobs[position] = entry

    def to_output(self) -> RequestOutput:
        """The cumulative RequestOutput of every sample."""
        completions = [
            CompletionOutput(index=s.index, text=s.detokenizer.output_text,
                             token_ids=list(s.request.output_token_ids), cumulative_logprob=s.cumulative_logprob,
                             logprobs=s.logprobs, finish_reason=s.finish_reason, stop_reason=s.stop_reason)
            for s in self.samples]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt.text,
                             prompt_token_ids=self.prompt.token_ids,
                             num_cached_tokens=self.samples[0].request.num_cached_tokens,
                             outputs=completions, finished=self.finished(), metrics=self.metrics,
                             # A copy: outputs cross to the server's thread while later steps fill the list.
                             prompt_logprobs=None if self.prompt_logprobs is None else list(self.prompt_logprobs))

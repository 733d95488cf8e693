"""What the engine hands back: one RequestOutput per request, holding one CompletionOutput per sample."""

import dataclasses
from typing import Literal, Optional, Union

FinishReason = Literal["stop", "length", "abort", "error"]  # the same values as core.request.FinishReason


@dataclasses.dataclass
class Logprob:
    """Log-probability of one token under the model's raw distribution."""

    logprob: float
    """log_softmax of the model's logits at this token (before temperature, penalties and filters)."""
    rank: int
    """1 for the most likely token of the vocabulary."""
    decoded_token: Optional[str] = None
    """The token's text."""


TokenLogprobs = dict[int, Logprob]
"""Per generated position: the sampled token and the top alternatives asked for."""


@dataclasses.dataclass
class CompletionOutput:
    """One sample (of n) of a request; text and token_ids are cumulative."""

    index: int
    """Which of the request's n samples this is."""
    text: str
    """Detokenized text released so far (stop strings and held-back text excluded)."""
    token_ids: list[int]
    """Generated token ids so far."""
    cumulative_logprob: Optional[float]
    """Sum of the sampled tokens' logprobs, when logprobs were requested."""
    logprobs: Optional[list[TokenLogprobs]]
    """Per generated token, when logprobs were requested."""
    finish_reason: Optional[FinishReason] = None
    """None while running; "stop" (EOS, stop token or stop string), "length", "abort", or "error" (the request failed
    alone: RequestOutput.error says why)."""
    stop_reason: Union[int, str, None] = None
    """The stop token id or stop string that ended the sample."""

    def finished(self) -> bool:
        """Whether this sample is done."""
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestMetrics:
    """Wall-clock times (time.time()) of a request's life."""

    arrival_time: float
    """When the request was added."""
    first_scheduled_time: Optional[float] = None
    """When a step first computed any of its prompt (the end of its time in the queue)."""
    first_token_time: Optional[float] = None
    """When the first generated token reached the host."""
    finish_time: Optional[float] = None
    """When the last sample finished."""


@dataclasses.dataclass
class RequestOutput:
    """The state of one request after an engine step (cumulative, like vLLM's default output kind)."""

    request_id: str
    """The id given at add time."""
    prompt: Optional[str]
    """Prompt text (None when the request came as token ids)."""
    prompt_token_ids: list[int]
    """Tokenized prompt."""
    num_cached_tokens: int
    """Prompt tokens served from the prefix cache (first sample's admission)."""
    outputs: list[CompletionOutput]
    """One per sample, index order."""
    finished: bool
    """True once every sample is done."""
    metrics: RequestMetrics
    """Arrival, first-token and finish times."""
    prompt_logprobs: Optional[list[Optional[dict[int, Logprob]]]] = None
    """With SamplingParams.prompt_logprobs: per prompt token, its logprob and the top alternatives (token id ->
    Logprob); None for the first token (nothing precedes it). None when not asked for."""
    error: Optional[str] = None
    """Why the request failed, when it did (finished, every sample's finish_reason "error"): one step of its own
    host work raised, and the engine failed it alone. The async engine and LLM raise RequestFailedError with it."""


class RequestFailedError(RuntimeError):
    """One request failed inside the engine (its own host work raised); the engine and other requests went on."""

    def __init__(self, request_id: str, reason: str) -> None:
        super().__init__(f"request {request_id!r} failed: {reason}")
        self.request_id = request_id
        """The failed request's id."""
        self.reason = reason
        """What raised, as "ExceptionType: message"."""

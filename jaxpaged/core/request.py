"""Request: one generation request's token state, lifecycle status and stop criteria (host-side, plain Python)."""

import enum
import time
from collections.abc import Sequence
from typing import Any, Literal, Optional

from ..checks import is_int


class RequestStatus(enum.Enum):
    """Where a request is in its lifecycle."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()
    """The engine failed this request alone (its own host work raised); the others went on."""

    def is_finished(self) -> bool:
        """True for the FINISHED_* states."""
        return self in _FINISH_REASONS


FinishReason = Literal["stop", "length", "abort", "error"]
_FINISH_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def _require_int(value: Any, field: str, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{field}: must be an int >= {minimum}, got {value!r}")


def _check_arguments(request_id: Any, prompt_token_ids: Sequence[int], max_tokens: Any, min_tokens: Any,
                     priority: Any, cache_salt: Any) -> None:
    """ValueError naming the field when a Request's arguments are out of range."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id: must be a non-empty str, got {request_id!r}")
    if len(prompt_token_ids) == 0:
        raise ValueError(f"prompt_token_ids: must hold at least one token, got {list(prompt_token_ids)!r}")
    _require_int(max_tokens, "max_tokens", 1)
    _require_int(min_tokens, "min_tokens", 0)
    if min_tokens > max_tokens:
        raise ValueError(f"min_tokens: must be <= max_tokens ({max_tokens}), got {min_tokens}")
    if not is_int(priority):
        raise ValueError(f"priority: must be an int, got {priority!r}")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise ValueError(f"cache_salt: must be a str or None, got {cache_salt!r}")


class Request:
    """Prompt and generated tokens of one request, how many of them have K/V computed, and when it stops.

    The scheduler owns the mutable state (status, num_computed_tokens, output tokens); the engine reads it.
    """

    # NOTE: __slots__ keeps attribute access cheap; the scheduler touches every running request every step.
    __slots__ = ("request_id", "prompt_token_ids", "output_token_ids", "all_token_ids", "num_computed_tokens",
                 "num_cached_tokens", "status", "arrival_time", "priority", "cache_salt", "sampling_params",
                 "stop_reason", "max_tokens", "min_tokens", "eos_token_id", "stop_token_ids", "ignore_eos",
                 "num_preemptions", "block_hashes", "sampling_seed", "grammar", "computes_whole_prompt",
                 "num_pending_tokens", "spec_token_ids", "num_step_tokens", "speculation", "lora_id", "lora_name",
                 "lora_fingerprint")

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int], *, max_tokens: int = 16,
                 min_tokens: int = 0, eos_token_id: Optional[int] = None, stop_token_ids: Sequence[int] = (),
                 ignore_eos: bool = False, arrival_time: Optional[float] = None, priority: int = 0,
                 cache_salt: Optional[str] = None, sampling_params: Any = None,
                 sampling_seed: Optional[int] = None, computes_whole_prompt: bool = False, lora_id: int = 0,
                 lora_name: Optional[str] = None, lora_fingerprint: Optional[str] = None) -> None:
        _check_arguments(request_id, prompt_token_ids, max_tokens, min_tokens, priority, cache_salt)
        _require_int(lora_id, "lora_id", 0)
        self.lora_id = lora_id
        """The LoRA adapter's id (lora_int_id), 0 for the base model: its K/V differs, so it joins the block hashes."""
        self.lora_name = lora_name
        """The adapter's name (KV events carry it), None for the base model."""
        self.lora_fingerprint = lora_fingerprint
        """A digest of the adapter's weights (lora/peft_adapter.py), in the block hashes beside its id and name."""
        self.request_id = request_id
        """Unique among the requests the scheduler currently holds."""
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        """The prompt, as given."""
        self.output_token_ids: list[int] = []
        """Generated tokens so far (a stop token that ended the request included)."""
        self.all_token_ids: list[int] = list(prompt_token_ids)
        """prompt_token_ids + output_token_ids, kept in step with both."""
        self.num_computed_tokens = 0
        """Tokens whose K/V is computed or scheduled to be computed (advanced by Scheduler.schedule())."""
        self.num_pending_tokens = 0
        """Tokens sampled by scheduled steps but not appended yet: 1 from schedule() to update_from_output(), and 2
        while async scheduling plans the next step before the one in flight has returned its token."""
        self.num_cached_tokens = 0
        """Prompt tokens served from the prefix cache at the first admission."""
        self.status = RequestStatus.WAITING
        """Lifecycle state."""
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        """When the request arrived (time.monotonic() unless given); breaks priority ties."""
        self.priority = priority
        """Under the "priority" policy a lower value is served first."""
        self.cache_salt = cache_salt
        """Requests with different salts never share prefix-cache blocks."""
        self.sampling_params = sampling_params
        """Opaque to the core: carried for the runner and the sampler."""
        self.sampling_seed = sampling_seed
        """The sampler's seed for this request (the user's, or one the engine drew); opaque to the core."""
        self.stop_reason: Optional[int] = None
        """The stop token id (from stop_token_ids) that ended the request, else None."""
        self.max_tokens = max_tokens
        """Most tokens to generate."""
        self.min_tokens = min_tokens
        """EOS and stop tokens do not end the request before this many tokens are generated."""
        self.eos_token_id = eos_token_id
        """End-of-sequence token, or None."""
        self.stop_token_ids = frozenset(stop_token_ids)
        """Tokens that end the request (with stop_reason set to the token)."""
        self.ignore_eos = ignore_eos
        """Keep generating past EOS (until max_tokens, max_model_len or a stop token)."""
        self.num_preemptions = 0
        """How many times the request was preempted (and its K/V recomputed)."""
        self.block_hashes: list[bytes] = []
        """Chain hashes of this request's full blocks, filled lazily by the KV cache manager."""
        self.computes_whole_prompt = computes_whole_prompt
        """Never served from the prefix cache: every prompt token is computed (prompt logprobs need their logits).
        Its blocks are still cached for other requests."""
        self.grammar: Any = None
        """Structured outputs: the sample's grammar state (a RequestGrammar; opaque to the core), else None."""
        self.spec_token_ids: list[int] = []
        """Speculative decoding: tokens proposed to follow all_token_ids, which the next step verifies (set by the
        engine's proposer after each update; the scheduler may take fewer)."""
        self.num_step_tokens = 0
        """Tokens the last update_from_output() appended: 1, or up to 1 + the accepted proposals."""
        self.speculation: Any = None
        """Speculative decoding's per-request state (acceptance so far, the proposer's index); opaque to the core."""

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        """True once the request stopped, hit a length limit or was aborted."""
        return self.status in _FINISH_REASONS

    @property
    def finish_reason(self) -> Optional[FinishReason]:
        """"stop", "length", "abort", "error", or None while unfinished (the OpenAI finish_reason, less "error": a
        failed request reaches a client as an error, never as a finish_reason)."""
        return _FINISH_REASONS.get(self.status)

    def append_output_token(self, token_id: int) -> None:
        """Record one generated token."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def drop_output_tokens(self, count: int) -> None:
        """Forget the newest `count` generated tokens (a stop string ended the text before them, in a step that
        accepted several): the request finishes next, and its K/V covers no token it no longer has."""
        if count <= 0:
            return
        del self.output_token_ids[-count:]
        del self.all_token_ids[-count:]
        self.num_computed_tokens = min(self.num_computed_tokens, len(self.all_token_ids))
        self.num_step_tokens -= count

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, num_tokens={self.num_tokens}, "
                f"num_computed_tokens={self.num_computed_tokens})")

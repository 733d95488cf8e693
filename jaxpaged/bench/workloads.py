"""Synthetic workloads: random lengths, a ShareGPT-like length mix, a shared system prompt, multi-turn chats.

Nothing is downloaded: every prompt is random token ids drawn from a seeded generator, so a workload is fully
determined by its parameters and every system in a run (jaxpaged and its peers) sees the very same prompts.
Output lengths are exact: requests run with EOS ignored and max_tokens set to the drawn length.
"""

import dataclasses
import math
from typing import Optional, Union

import numpy as np

from jaxpaged.checks import is_int, is_number


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """One request of a workload."""

    prompt_token_ids: tuple[int, ...]
    """The full prompt (for a multi-turn chat, the history of the conversation included)."""
    max_tokens: int
    """Tokens to generate (EOS is ignored, so exactly this many)."""
    conversation_id: Optional[int] = None
    """Requests of one conversation run one after the other (turn order); None: independent."""
    turn: int = 0
    """Position of the request in its conversation; offline runs go round by round over turns."""


def _fail(field: str, message: str, value) -> None:
    raise ValueError(f"workload.{field}: {message}, got {value!r}")


def _check_int(field: str, value, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        _fail(field, f"must be an int >= {minimum}", value)


def _check_range(low_field: str, low: int, high_field: str, high: int) -> None:
    if low > high:
        _fail(low_field, f"must be <= {high_field} ({high})", low)


@dataclasses.dataclass(frozen=True)
class _Common:
    num_requests: int = 64
    """Requests in the workload (multi_turn: conversations x turns, derived)."""
    seed: int = 0
    """Seed of every random draw of the workload."""
    token_id_low: int = 1000
    """Prompt token ids are drawn uniformly from [token_id_low, token_id_high) (clear of special tokens)."""
    token_id_high: int = 30000

    def __post_init__(self) -> None:
        _check_int("num_requests", self.num_requests, 1)
        _check_int("seed", self.seed, 0)
        _check_int("token_id_low", self.token_id_low, 0)
        _check_int("token_id_high", self.token_id_high, 1)
        if self.token_id_high <= self.token_id_low:
            _fail("token_id_high", f"must be > token_id_low ({self.token_id_low})", self.token_id_high)


@dataclasses.dataclass(frozen=True)
class RandomWorkload(_Common):
    """Prompt and output lengths uniform in [min, max] (the W1 shape: 32-256 prompt, 64 output)."""

    min_prompt_len: int = 32
    max_prompt_len: int = 256
    min_output_len: int = 64
    max_output_len: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("min_prompt_len", "max_prompt_len", "min_output_len", "max_output_len"):
            _check_int(name, getattr(self, name), 1)
        _check_range("min_prompt_len", self.min_prompt_len, "max_prompt_len", self.max_prompt_len)
        _check_range("min_output_len", self.min_output_len, "max_output_len", self.max_output_len)


@dataclasses.dataclass(frozen=True)
class ShareGPTWorkload(_Common):
    """Log-normal prompt and output lengths shaped like ShareGPT conversations (long right tails), clipped."""

    prompt_len_median: float = 110.0
    prompt_len_sigma: float = 1.1
    """Standard deviation of log(prompt length)."""
    output_len_median: float = 150.0
    output_len_sigma: float = 0.9
    min_len: int = 4
    """Both lengths are clipped to at least this (ShareGPT benchmarks drop shorter turns)."""
    max_prompt_len: int = 1024
    max_output_len: int = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("prompt_len_median", "prompt_len_sigma", "output_len_median", "output_len_sigma"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) \
                    or value <= 0:
                _fail(name, "must be a positive number", value)
        for name in ("min_len", "max_prompt_len", "max_output_len"):
            _check_int(name, getattr(self, name), 1)
        _check_range("min_len", self.min_len, "max_prompt_len", self.max_prompt_len)
        _check_range("min_len", self.min_len, "max_output_len", self.max_output_len)


@dataclasses.dataclass(frozen=True)
class SharedPrefixWorkload(_Common):
    """A long system prompt shared by every request, then a varying question (the helpdesk shape)."""

    prefix_len: int = 1000
    num_prefixes: int = 1
    """Distinct system prompts; request i uses prefix i % num_prefixes."""
    head_len: int = 0
    """Varying tokens before the system prompt (a timestamp first: the trap no prefix cache can serve)."""
    min_question_len: int = 16
    max_question_len: int = 64
    output_len: int = 32
    visit_rounds: bool = False
    """Request i is in round i // num_prefixes (every prefix once per round), and offline runs finish a round before
    the next: later rounds revisit prefixes the earlier ones computed."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_int("prefix_len", self.prefix_len, 0)
        _check_int("head_len", self.head_len, 0)
        if not isinstance(self.visit_rounds, bool):
            _fail("visit_rounds", "must be a bool", self.visit_rounds)
        for name in ("num_prefixes", "min_question_len", "max_question_len", "output_len"):
            _check_int(name, getattr(self, name), 1)
        _check_range("min_question_len", self.min_question_len, "max_question_len", self.max_question_len)


@dataclasses.dataclass(frozen=True)
class MultiTurnWorkload(_Common):
    """Conversations of several turns; turn k's prompt is the whole history plus a new question.

    The assistant replies inside the history are synthetic tokens of output_len, not the model's own output, so
    every system sees identical prompts; what a turn can reuse is the previous turn's prompt.
    """

    num_conversations: int = 8
    num_turns: int = 4
    system_prompt_len: int = 0
    min_question_len: int = 16
    max_question_len: int = 64
    output_len: int = 32

    def __post_init__(self) -> None:
        for name in ("num_conversations", "num_turns", "min_question_len", "max_question_len", "output_len"):
            _check_int(name, getattr(self, name), 1)
        # num_requests is derived, so it is not a parameter the YAML may set to something else.
        object.__setattr__(self, "num_requests", self.num_conversations * self.num_turns)
        super().__post_init__()
        _check_int("system_prompt_len", self.system_prompt_len, 0)
        _check_range("min_question_len", self.min_question_len, "max_question_len", self.max_question_len)


WorkloadSpec = Union[RandomWorkload, ShareGPTWorkload, SharedPrefixWorkload, MultiTurnWorkload]
WORKLOAD_KINDS: dict[str, type] = {"random": RandomWorkload, "sharegpt": ShareGPTWorkload,
                                   "shared_prefix": SharedPrefixWorkload, "multi_turn": MultiTurnWorkload}


def make_workload_spec(params: dict) -> WorkloadSpec:
    """The validated spec of a workload section ({"kind": ..., parameters...}); ValueError naming the field."""
    if not isinstance(params, dict):
        raise ValueError(f"workload: must be a mapping, got {params!r}")
    params = dict(params)
    kind = params.pop("kind", None)
    if kind not in WORKLOAD_KINDS:
        raise ValueError(f"workload.kind: must be one of {sorted(WORKLOAD_KINDS)}, got {kind!r}")
    spec_cls = WORKLOAD_KINDS[kind]
    allowed = {field.name for field in dataclasses.fields(spec_cls)}
    if kind == "multi_turn":
        allowed.discard("num_requests")
    for key in params:
        if key not in allowed:
            raise ValueError(f"workload.{key}: unknown parameter for kind {kind!r} (known: {sorted(allowed)})")
    return spec_cls(**params)


def workload_kind(spec: WorkloadSpec) -> str:
    """The YAML kind name of a spec."""
    return next(kind for kind, cls in WORKLOAD_KINDS.items() if isinstance(spec, cls))


def generate_requests(spec: WorkloadSpec) -> list[BenchRequest]:
    """The workload's requests, in arrival order (deterministic in the spec)."""
    rng = np.random.default_rng(spec.seed)
    if isinstance(spec, RandomWorkload):
        return _random_requests(spec, rng)
    if isinstance(spec, ShareGPTWorkload):
        return _sharegpt_requests(spec, rng)
    if isinstance(spec, SharedPrefixWorkload):
        return _shared_prefix_requests(spec, rng)
    if isinstance(spec, MultiTurnWorkload):
        return _multi_turn_requests(spec, rng)
    raise ValueError(f"workload: unknown spec {spec!r}")


def _tokens(spec: WorkloadSpec, rng: np.random.Generator, length: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(spec.token_id_low, spec.token_id_high, size=length))


def _random_requests(spec: RandomWorkload, rng: np.random.Generator) -> list[BenchRequest]:
    prompt_lens = rng.integers(spec.min_prompt_len, spec.max_prompt_len + 1, size=spec.num_requests)
    output_lens = rng.integers(spec.min_output_len, spec.max_output_len + 1, size=spec.num_requests)
    return [BenchRequest(_tokens(spec, rng, int(p)), int(o)) for p, o in zip(prompt_lens, output_lens)]


def lognormal_lens(rng: np.random.Generator, median: float, sigma: float, low: int, high: int,
                   size: int) -> np.ndarray:
    """Integer lengths exp(N(log median, sigma)), rounded and clipped to [low, high]."""
    draws = np.exp(rng.normal(math.log(median), sigma, size=size))
    return np.clip(np.rint(draws), low, high).astype(np.int64)


def _sharegpt_requests(spec: ShareGPTWorkload, rng: np.random.Generator) -> list[BenchRequest]:
    prompt_lens = lognormal_lens(rng, spec.prompt_len_median, spec.prompt_len_sigma, spec.min_len,
                                 spec.max_prompt_len, spec.num_requests)
    output_lens = lognormal_lens(rng, spec.output_len_median, spec.output_len_sigma, spec.min_len,
                                 spec.max_output_len, spec.num_requests)
    return [BenchRequest(_tokens(spec, rng, int(p)), int(o)) for p, o in zip(prompt_lens, output_lens)]


def _shared_prefix_requests(spec: SharedPrefixWorkload, rng: np.random.Generator) -> list[BenchRequest]:
    prefixes = [_tokens(spec, rng, spec.prefix_len) for _ in range(spec.num_prefixes)]
    question_lens = rng.integers(spec.min_question_len, spec.max_question_len + 1, size=spec.num_requests)
    # The questions are drawn first, so head_len changes nothing else: the variants share prefix and questions.
    questions = [_tokens(spec, rng, int(q)) for q in question_lens]
    heads = [_tokens(spec, rng, spec.head_len) for _ in range(spec.num_requests)]
    return [BenchRequest(heads[index] + prefixes[index % spec.num_prefixes] + question, spec.output_len,
                         turn=index // spec.num_prefixes if spec.visit_rounds else 0)
            for index, question in enumerate(questions)]


def _multi_turn_requests(spec: MultiTurnWorkload, rng: np.random.Generator) -> list[BenchRequest]:
    histories = [_tokens(spec, rng, spec.system_prompt_len) for _ in range(spec.num_conversations)]
    requests = []
    for turn in range(spec.num_turns):
        for conversation in range(spec.num_conversations):
            question_len = int(rng.integers(spec.min_question_len, spec.max_question_len + 1))
            prompt = histories[conversation] + _tokens(spec, rng, question_len)
            requests.append(BenchRequest(prompt, spec.output_len, conversation_id=conversation, turn=turn))
            histories[conversation] = prompt + _tokens(spec, rng, spec.output_len)  # the synthetic reply
    return requests


def group_by_turn(requests: list[BenchRequest]) -> list[list[int]]:
    """Request indices round by round (turn 0 of every conversation, then turn 1, ...)."""
    rounds: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        rounds.setdefault(request.turn, []).append(index)
    return [rounds[turn] for turn in sorted(rounds)]

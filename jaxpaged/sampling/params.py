"""SamplingParams: how one request picks its tokens and when it stops, validated at construction.

Shaped like vLLM's offline API. Every bad value raises a ValueError that names the field and what it got.
Token ids can only be checked against a vocabulary once the model is known, so that check is a separate
call, `validate_token_ids`, made by the engine on the host (JAX silently clamps out-of-range indices).
"""

import dataclasses
import math
from typing import Literal, Optional, Union

from jaxpaged.checks import is_int, is_number

MAX_LOGPROBS = 20
"""Most top logprobs one request may ask for per token (the OpenAI limit)."""

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (as vLLM does): dividing logits by them overflows float32."""

MAX_ABS_PENALTY = 2.0
"""presence_penalty and frequency_penalty lie in [-MAX_ABS_PENALTY, MAX_ABS_PENALTY]."""

MAX_ABS_LOGIT_BIAS = 100.0
"""A logit_bias value lies in [-MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS]."""

MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
"""Bounds on `stop`: the detokenizer looks for every stop string in the text each step, so their count and
length bound a request's work per token (OpenAI allows 4 strings; these leave room for tool templates)."""


_CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object")

OutputKind = Literal["cumulative", "final_only"]
OUTPUT_KINDS: tuple[OutputKind, ...] = ("cumulative", "final_only")


@dataclasses.dataclass(frozen=True)
class StructuredOutputsParams:
    """One constraint on the output's text, as vLLM's StructuredOutputsParams: exactly one field is set.

    The engine compiles it with llguidance when the request is added; an invalid schema, regex or grammar is a
    ValueError naming `field` (so the server's 400 names the field the client actually sent).
    """

    json: Union[dict, str, bool, None] = None
    """A JSON schema (a dict, or its JSON text): the output is one JSON value that validates against it."""
    regex: Optional[str] = None
    """The whole output matches this regular expression (Rust regex syntax)."""
    choice: Optional[list[str]] = None
    """The output is exactly one of these strings."""
    grammar: Optional[str] = None
    """A Lark grammar (llguidance's dialect; `start` is the output)."""
    json_object: bool = False
    """The output is any JSON object (OpenAI's response_format {"type": "json_object"})."""
    origin: Optional[str] = None
    """The request field this came from (e.g. "response_format", "guided_json"), for error messages."""

    def _given(self) -> list[str]:
        # json_object is a flag (set when True); every other field is set when not None (json=False is a schema).
        return [name for name in _CONSTRAINT_FIELDS
                if (self.json_object if name == "json_object" else getattr(self, name) is not None)]

    def __post_init__(self) -> None:
        given = self._given()
        if len(given) != 1:
            _fail("structured_outputs", f"must set exactly one of {list(_CONSTRAINT_FIELDS)}", given)
        if self.regex is not None and not isinstance(self.regex, str):
            _fail(self.field, "must be a str", self.regex)
        if self.grammar is not None and not isinstance(self.grammar, str):
            _fail(self.field, "must be a str", self.grammar)
        if self.choice is not None and (not isinstance(self.choice, (list, tuple)) or not self.choice
                                        or not all(isinstance(c, str) for c in self.choice)):
            _fail(self.field, "must be a non-empty list of str", self.choice)
        if self.json is not None and not isinstance(self.json, (dict, str, bool)):
            _fail(self.field, "must be a JSON schema (a dict or its JSON text)", self.json)
        _check_bool("json_object", self.json_object)

    @property
    def field(self) -> str:
        """The field errors name: `origin` when given, else structured_outputs.<the constraint>."""
        return self.origin or f"structured_outputs.{self._given()[0]}"


def _fail(field: str, message: str, value) -> None:
    raise ValueError(f"{field}: {message}, got {value!r}")


def _check_float(field: str, value, low: float, high: float, *, low_open: bool = False) -> float:
    """Checks a finite real number in [low, high] (or (low, high]) and returns it as a float."""
    if not is_number(value):
        _fail(field, "must be a number", value)
    if not math.isfinite(value):
        _fail(field, "must be finite", value)
    below = value <= low if low_open else value < low
    if below or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        _fail(field, f"must be in {interval}", value)
    return float(value)


def _check_bool(field: str, value) -> None:
    if not isinstance(value, bool):
        _fail(field, "must be a bool", value)


def _normalize_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        _fail("stop", "must be a str or a list of str", stop)
    if len(stop) > MAX_STOP_STRINGS:
        _fail("stop", f"must hold at most {MAX_STOP_STRINGS} strings", f"{len(stop)} strings")
    for item in stop:
        if not isinstance(item, str):
            _fail("stop", "must hold only strings", item)
        if not item:
            _fail("stop", "must not contain an empty string (it would match at once)", item)
        if len(item) > MAX_STOP_STRING_CHARS:
            _fail("stop", f"strings must be at most {MAX_STOP_STRING_CHARS} characters", f"{len(item)} characters")
    return list(stop)


def _normalize_stop_token_ids(stop_token_ids) -> list[int]:
    if stop_token_ids is None:
        return []
    if not isinstance(stop_token_ids, (list, tuple)):
        _fail("stop_token_ids", "must be a list of int", stop_token_ids)
    for token_id in stop_token_ids:
        if not is_int(token_id) or token_id < 0:
            _fail("stop_token_ids", "must hold only ints >= 0", token_id)
    return list(stop_token_ids)


def _normalize_logit_bias(logit_bias) -> Optional[dict[int, float]]:
    if logit_bias is None:
        return None
    if not isinstance(logit_bias, dict):
        _fail("logit_bias", "must be a dict {token id: bias}", logit_bias)
    normalized = {}
    for key, bias in logit_bias.items():
        # JSON objects (the OpenAI API) only have string keys, so "42" is taken as token 42.
        token_id = int(key) if isinstance(key, str) and key.isdigit() else key
        if not is_int(token_id) or token_id < 0:
            _fail("logit_bias", "keys must be token ids (ints >= 0)", key)
        normalized[token_id] = _check_float(f"logit_bias[{token_id}]", bias,
                                            -MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS)
    return normalized


@dataclasses.dataclass
class SamplingParams:
    """How one request samples its tokens and when it stops."""

    n: int = 1
    """Number of completions to return for the prompt."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax), and so does anything below GREEDY_TEMPERATURE."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sum reaches top_p, in (0, 1]."""
    top_k: int = 0
    """Keep only the top_k most likely tokens; 0 or -1 turns it off."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's, in [0, 1]."""
    seed: Optional[int] = None
    """Seed of this request's random draws; None lets the engine pick one. Reduced modulo 2**64."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already in the output, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it is already in the output, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """HF-style penalty (> 0) on tokens of prompt or output: positive logits divided, negative multiplied."""
    logit_bias: Optional[dict[int, float]] = None
    """Added to the logits of the given token ids before sampling, each bias in [-100, 100]."""
    stop: Optional[Union[str, list[str]]] = None
    """Strings that end the completion when they appear in the output text; normalized to a list."""
    stop_token_ids: Optional[list[int]] = None
    """Token ids that end the completion when sampled; normalized to a list."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string (or stop token's text) at the end of the output text."""
    max_tokens: int = 16
    """Most tokens to generate for each completion (>= 1)."""
    min_tokens: int = 0
    """EOS and stop_token_ids cannot be sampled before this many tokens (<= max_tokens)."""
    ignore_eos: bool = False
    """Keep generating after the model's EOS token."""
    logprobs: Optional[int] = None
    """Return this many top logprobs per token (0..20) besides the sampled token's; None returns none."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the output text."""
    structured_outputs: Optional[StructuredOutputsParams] = None
    """Constrain the output to a JSON schema, regex, choice or grammar (None: unconstrained)."""
    prompt_logprobs: Optional[int] = None
    """Return each prompt token's logprob and this many top alternatives (0..20; the first token has none).
    Such a request computes its whole prompt (no prefix-cache hits), in the same compiled step."""
    output_kind: OutputKind = "cumulative"
    """"cumulative": an output after every step the request progressed in (to stream it); "final_only": only its
    last one (vLLM's RequestOutputKind.FINAL_ONLY: nothing is built or handed over per step)."""

    def __post_init__(self) -> None:
        if not is_int(self.n) or self.n < 1:
            _fail("n", "must be an int >= 1", self.n)
        self.temperature = _check_float("temperature", self.temperature, 0.0, math.inf)
        self.top_p = _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if not is_int(self.top_k) or (self.top_k < 1 and self.top_k not in (0, -1)):
            _fail("top_k", "must be 0 or -1 (off) or an int >= 1", self.top_k)
        self.min_p = _check_float("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None and not is_int(self.seed):
            _fail("seed", "must be an int or None", self.seed)
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, _check_float(name, getattr(self, name), -MAX_ABS_PENALTY, MAX_ABS_PENALTY))
        self.repetition_penalty = _check_float("repetition_penalty", self.repetition_penalty,
                                               0.0, math.inf, low_open=True)
        self.logit_bias = _normalize_logit_bias(self.logit_bias)
        self.stop = _normalize_stop(self.stop)
        self.stop_token_ids = _normalize_stop_token_ids(self.stop_token_ids)
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            _fail("max_tokens", "must be an int >= 1", self.max_tokens)
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            _fail("min_tokens", "must be an int >= 0", self.min_tokens)
        if self.min_tokens > self.max_tokens:
            _fail("min_tokens", f"must be <= max_tokens ({self.max_tokens})", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or not 0 <= value <= MAX_LOGPROBS):
                _fail(name, f"must be None or an int in [0, {MAX_LOGPROBS}]", value)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens"):
            _check_bool(name, getattr(self, name))
        if self.output_kind not in OUTPUT_KINDS:
            _fail("output_kind", f"must be one of {list(OUTPUT_KINDS)}", self.output_kind)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            _fail("structured_outputs", "must be a StructuredOutputsParams or None", self.structured_outputs)

    @property
    def is_greedy(self) -> bool:
        """True when temperature is 0 (or below GREEDY_TEMPERATURE): the argmax token is taken, seed unused."""
        return self.temperature < GREEDY_TEMPERATURE

    def validate_token_ids(self, vocab_size: int) -> None:
        """Checks stop_token_ids and logit_bias keys lie in [0, vocab_size); ValueError naming the field."""
        for token_id in self.stop_token_ids or ():  # a list once __post_init__ has normalized it
            if token_id >= vocab_size:
                _fail("stop_token_ids", f"must be < vocab_size ({vocab_size})", token_id)
        for token_id in self.logit_bias or {}:
            if token_id >= vocab_size:
                _fail("logit_bias", f"keys must be < vocab_size ({vocab_size})", token_id)

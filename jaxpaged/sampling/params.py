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

MAX_N = 2**16
"""Most samples one request may ask for: each is a sequence with its own state, built when the request is added."""

MAX_INT32 = 2**31 - 1
"""Bound of every count and token id: positions, lengths and ids travel to the device as int32."""

MAX_STOP_TOKEN_IDS = 1024
"""Most stop_token_ids: while min_tokens holds them back, each is written into the step's bias row."""

SEED_RANGE = (-(2**63), 2**64 - 1)
"""A seed is any int64 or uint64 value (vLLM's API takes int64; the row table keeps it modulo 2**64)."""

REPETITION_PENALTY_RANGE = (1e-4, 1e4)
"""repetition_penalty divides positive logits and multiplies negative ones: inside this range a float32 logit stays
finite (a positive penalty near 0, which the API's "> 0" allowed, turned logits into inf and the softmax into NaN)."""

_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 1.1754943508222875e-38
"""The float32 range a row's parameters are cast to: a nonzero value outside it would become 0 or inf there."""

_MAX_TOKEN_ID_DIGITS = len(str(MAX_INT32))
"""A logit_bias key written with more digits than this cannot be a token id (and int() of a 5,000-digit string
raises a ValueError that names no field)."""


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
    starts_after: Optional[str] = None
    """The constraint holds only for the text after the output has written this marker (a reasoning model's
    `</think>`): what comes before it is free, so a thinking model thinks before it answers in the schema (vLLM
    starts a grammar once the reasoning ends). None: from the first token."""

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
        if self.starts_after is not None and (not isinstance(self.starts_after, str) or not self.starts_after):
            _fail("structured_outputs.starts_after", "must be a non-empty str", self.starts_after)

    @property
    def field(self) -> str:
        """The field errors name: `origin` when given, else structured_outputs.<the constraint>."""
        return self.origin or f"structured_outputs.{self._given()[0]}"


def _fail(field: str, message: str, value) -> None:
    raise ValueError(f"{field}: {message}, got {_shown(value)}")


def _shown(value) -> str:
    """The value as an error message shows it: a huge int by its size (repr of a 5,000-digit int raises)."""
    if is_int(value) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


def _check_float(field: str, value, low: float, high: float, *, low_open: bool = False) -> float:
    """Checks a finite real number in [low, high] (or (low, high]) that float32 holds, and returns it as a float."""
    if not is_number(value):
        _fail(field, "must be a number", value)
    # NOTE: an int may be too large for a float (10**309 overflows float()): compare before converting.
    if abs(value) > _FLOAT32_MAX or (isinstance(value, float) and math.isnan(value)):
        _fail(field, "must be finite (float32's range: at most 3.4e38 in magnitude)", value)
    below = value <= low if low_open else value < low
    if below or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        _fail(field, f"must be in {interval}", value)
    value = float(value)
    if value != 0.0 and not _FLOAT32_TINY <= abs(value) <= _FLOAT32_MAX:
        _fail(field, "must be 0 or of a magnitude float32 holds (1.2e-38 to 3.4e38)", value)
    return value


def _check_int(field: str, value, low: int, high: int) -> int:
    """Checks an int (not a bool) in [low, high]; Python ints are unbounded, so every int field has a ceiling."""
    if not is_int(value) or not low <= value <= high:
        _fail(field, f"must be an int in [{low}, {high}]", value)
    return value


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


def _normalize_token_id_list(field: str, token_ids) -> list[int]:
    if not isinstance(token_ids, (list, tuple)):
        _fail(field, "must be a list of int", token_ids)
    for token_id in token_ids:
        if not is_int(token_id) or not 0 <= token_id <= MAX_INT32:
            _fail(field, f"must hold only ints in [0, {MAX_INT32}]", token_id)
    return list(token_ids)


def _normalize_stop_token_ids(stop_token_ids) -> list[int]:
    if stop_token_ids is None:
        return []
    if not isinstance(stop_token_ids, (list, tuple)):
        _fail("stop_token_ids", "must be a list of int", stop_token_ids)
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        _fail("stop_token_ids", f"must hold at most {MAX_STOP_TOKEN_IDS} ids", f"{len(stop_token_ids)} ids")
    for token_id in stop_token_ids:
        if not is_int(token_id) or not 0 <= token_id <= MAX_INT32:
            _fail("stop_token_ids", f"must hold only ints in [0, {MAX_INT32}]", token_id)
    return list(stop_token_ids)


def logit_bias_token_id(key) -> Optional[int]:
    """A logit_bias key as a token id: an int in [0, MAX_INT32], or (JSON objects only have string keys) its
    ASCII decimal string; None when it is neither."""
    if isinstance(key, str):
        if not (key.isascii() and key.isdigit() and len(key) <= _MAX_TOKEN_ID_DIGITS):
            return None
        key = int(key)
    return key if is_int(key) and 0 <= key <= MAX_INT32 else None


def _normalize_logit_bias(logit_bias) -> Optional[dict[int, float]]:
    if logit_bias is None:
        return None
    if not isinstance(logit_bias, dict):
        _fail("logit_bias", "must be a dict {token id: bias}", logit_bias)
    normalized = {}
    for key, bias in logit_bias.items():
        token_id = logit_bias_token_id(key)
        if token_id is None:
            _fail("logit_bias", f"keys must be token ids (ints in [0, {MAX_INT32}])",
                  f"a key of {len(key)} characters" if isinstance(key, str) and len(key) > 40 else key)
        if not is_number(bias) or (isinstance(bias, float) and not math.isfinite(bias)):
            _fail(f"logit_bias[{token_id}]", "must be a finite number", bias)
        # Any finite bias is taken, clamped to OpenAI's [-100, 100] as vLLM does (an int is compared, never
        # converted, until it is in range).
        normalized[token_id] = float(min(max(bias, -MAX_ABS_LOGIT_BIAS), MAX_ABS_LOGIT_BIAS))
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
    """Keep only the top_k most likely tokens; 0 or -1 turns it off, and so does a top_k at or above the vocabulary
    size (the sampler clamps it there, as vLLM does)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's, in [0, 1]."""
    seed: Optional[int] = None
    """Seed of this request's random draws, in SEED_RANGE; None lets the engine pick one. Reduced modulo 2**64."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token already in the output, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it is already in the output, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """HF-style penalty on tokens of prompt or output: positive logits divided, negative multiplied; in
    REPETITION_PENALTY_RANGE."""
    logit_bias: Optional[dict[int, float]] = None
    """Added to the logits of the given token ids before sampling; each bias is clamped to [-100, 100]."""
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
    allowed_token_ids: Optional[list[int]] = None
    """vLLM's: only these token ids may be sampled (None: any). Must not be empty."""
    bad_words_token_ids: Optional[list[list[int]]] = None
    """vLLM's bad_words as token sequences: a sequence's last token is banned wherever the output ends with the
    tokens before it (a one-token sequence is banned everywhere). The server tokenizes the words."""
    output_kind: OutputKind = "cumulative"
    """"cumulative": an output after every step the request progressed in (to stream it); "final_only": only its
    last one (vLLM's RequestOutputKind.FINAL_ONLY: nothing is built or handed over per step)."""

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1, MAX_N)
        self.temperature = _check_float("temperature", self.temperature, 0.0, _FLOAT32_MAX)
        self.top_p = _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if not is_int(self.top_k) or self.top_k < -1:
            _fail("top_k", "must be 0 or -1 (off) or an int >= 1", self.top_k)
        self.min_p = _check_float("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _check_int("seed", self.seed, *SEED_RANGE)
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, _check_float(name, getattr(self, name), -MAX_ABS_PENALTY, MAX_ABS_PENALTY))
        self.repetition_penalty = _check_float("repetition_penalty", self.repetition_penalty,
                                               *REPETITION_PENALTY_RANGE)
        self.logit_bias = _normalize_logit_bias(self.logit_bias)
        self.stop = _normalize_stop(self.stop)
        self.stop_token_ids = _normalize_stop_token_ids(self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _normalize_token_id_list("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                _fail("allowed_token_ids", "must hold at least one id (or be None)", self.allowed_token_ids)
        if self.bad_words_token_ids is not None:
            self.bad_words_token_ids = [_normalize_token_id_list("bad_words_token_ids", word)
                                        for word in self.bad_words_token_ids]
            if not all(self.bad_words_token_ids):
                _fail("bad_words_token_ids", "must not hold an empty sequence", self.bad_words_token_ids)
        _check_int("max_tokens", self.max_tokens, 1, MAX_INT32)
        _check_int("min_tokens", self.min_tokens, 0, MAX_INT32)
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
        for field, token_ids in (("allowed_token_ids", self.allowed_token_ids or ()),
                                 *(("bad_words", word) for word in self.bad_words_token_ids or ())):
            for token_id in token_ids:
                if token_id >= vocab_size:
                    _fail(field, f"token ids must be < vocab_size ({vocab_size})", token_id)

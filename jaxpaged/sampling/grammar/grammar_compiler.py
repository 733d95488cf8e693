"""GrammarCompiler: a request's StructuredOutputsParams -> a validated llguidance grammar -> one matcher per sample.

Everything is checked when the request is added (a bad schema, regex or grammar is a ValueError naming the field
the user set, so the server answers 400 before anything runs); a request never fails mid-stream because of its
grammar. llguidance (Rust, no torch) is what vLLM uses; its tokenizer view is built once per engine.
"""

import collections
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf

from jaxpaged.sampling.grammar.request_grammar import RequestGrammar
from jaxpaged.sampling.params import StructuredOutputsParams

if TYPE_CHECKING:  # the options' TypedDict exists only in llguidance's type stubs
    from llguidance._lib import JsonCompileOptions

# A JSON object of any shape: OpenAI's response_format {"type": "json_object"}.
_ANY_JSON_OBJECT = {"type": "object"}
# JSON laid out as json.dumps does ({"a": 1, "b": [2, 3]}). Free whitespace between tokens lets a small model
# loop on newlines and tabs until max_tokens (seen with SmolLM2-135M); vLLM's disable_any_whitespace does the same.
_JSON_LAYOUT: "JsonCompileOptions" = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCompiler:
    """Compiles and validates grammars against the model's tokenizer; makes the per-sample matchers."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        """`vocab_size`: the logits' width (a model may pad its vocabulary past the tokenizer's)."""
        self.vocab_size = vocab_size
        self._hf_tokenizer = hf_tokenizer
        self._eos_token_ids = list(eos_token_ids)
        self._tokenizer = None  # built on first use: ~0.4 s, and most engines never see a grammar
        self._cache: collections.OrderedDict[tuple, str] = collections.OrderedDict()
        """Valid grammars by their source (_cache_key), least recently used first."""

    @property
    def tokenizer(self) -> "llguidance.LLTokenizer":
        if self._tokenizer is None:
            eos = self._eos_token_ids or None
            self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self.vocab_size,
                                                           eos_token=eos)
        return self._tokenizer

    def compile(self, params: StructuredOutputsParams) -> str:
        """The llguidance grammar of `params`; ValueError "<params.field>: <why>" if it is not a valid one.

        Valid grammars are kept by their source (the last GRAMMAR_CACHE_SIZE): a client sending the same schema
        with every request (tools, response_format) pays llguidance's compile once, not on every add."""
        field = params.field
        try:
            schema = _schema_of(params) if params.json is not None else None  # parsed and checked once
            key = _cache_key(params, schema)
            grammar = self._cache.get(key)
            if grammar is not None:
                self._cache.move_to_end(key)
                return grammar
            grammar = _grammar_of(params, schema)
        except (TypeError, ValueError) as error:  # e.g. a schema that is no JSON
            raise ValueError(f"{field}: {error}") from None
        problem = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if problem:
            raise ValueError(f"{field}: {problem}")
        self._cache[key] = grammar
        if len(self._cache) > GRAMMAR_CACHE_SIZE:
            self._cache.popitem(last=False)
        return grammar

    def new_request_grammar(self, grammar: str) -> RequestGrammar:
        """A fresh matcher at the start of the output (one per sample: each consumes its own tokens)."""
        return RequestGrammar(llguidance.LLMatcher(self.tokenizer, grammar, log_level=0), -(-self.vocab_size // 32))


GRAMMAR_CACHE_SIZE = 256
MAX_SCHEMA_DEPTH = 64
"""Most levels of nesting a JSON schema may have: deeper ones are refused before Python's recursion (a 500) or
llguidance's (its stack) meets them."""


def _schema_of(params: StructuredOutputsParams) -> Any:
    """The JSON schema, parsed when given as text; ValueError if it is nested deeper than MAX_SCHEMA_DEPTH."""
    if not isinstance(params.json, str):
        schema = params.json
    else:
        try:
            schema = json.loads(params.json)
        except RecursionError:
            raise ValueError(f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels") from None
    check_schema_depth(schema)
    return schema


def check_schema_depth(schema: Any) -> None:
    """ValueError if a parsed JSON schema is nested deeper than MAX_SCHEMA_DEPTH (also for schemas a grammar
    embeds, such as the tools' in a tool_choice "auto" grammar)."""
    stack = [(schema, 1)]
    while stack:  # iterative: the check itself must not recurse
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_SCHEMA_DEPTH:
                    raise ValueError(f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels")
                stack.append((child, depth + 1))


def _cache_key(params: StructuredOutputsParams, schema: Any) -> tuple:
    """What a grammar is made from, hashable: the same constraint sent twice has the same key (`schema`: the
    parsed JSON schema, when params has one)."""
    if params.json is not None:
        return ("json", json.dumps(schema, sort_keys=True))
    if params.choice is not None:
        return ("choice", tuple(params.choice))
    return ("json_object",) if params.json_object else ("regex", params.regex) if params.regex is not None \
        else ("grammar", params.grammar)


def _grammar_of(params: StructuredOutputsParams, schema: Any) -> str:
    matcher = llguidance.LLMatcher
    if params.json is not None:
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        return matcher.grammar_from_json_schema(schema if isinstance(schema, dict) else json.dumps(schema),
                                                overrides=_JSON_LAYOUT)
    if params.json_object:
        return matcher.grammar_from_json_schema(_ANY_JSON_OBJECT, overrides=_JSON_LAYOUT)
    if params.regex is not None:
        return matcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        return llguidance.grammar_from("choice", json.dumps(list(params.choice)))
    assert params.grammar is not None  # StructuredOutputsParams holds exactly one constraint
    return matcher.grammar_from_lark(params.grammar)

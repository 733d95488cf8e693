"""A constraint's source: StructuredOutputsParams -> a checked, canonical key -> llguidance's grammar text.

constraint_key runs in the engine's process (it parses and measures the constraint, against limits.py); grammar_of_key
runs in the grammar worker (llguidance's JSON-schema and regex front ends may crash on hostile input).
"""

import json
from typing import TYPE_CHECKING, Any

import llguidance

from jaxpaged.sampling.grammar.limits import MAX_SCHEMA_DEPTH, check_constraint_size
from jaxpaged.sampling.params import StructuredOutputsParams

if TYPE_CHECKING:  # the options' TypedDict exists only in llguidance's type stubs
    from llguidance._lib import JsonCompileOptions

# A JSON object of any shape: OpenAI's response_format {"type": "json_object"}.
_ANY_JSON_OBJECT = {"type": "object"}
# JSON laid out as json.dumps does ({"a": 1, "b": [2, 3]}). Free whitespace between tokens lets a small model
# loop on newlines and tabs until max_tokens (seen with SmolLM2-135M); vLLM's disable_any_whitespace does the same.
_JSON_LAYOUT: "JsonCompileOptions" = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def constraint_key(params: StructuredOutputsParams) -> tuple:
    """What the grammar is made from, hashable and canonical (a schema sent as a dict or as JSON text in any layout
    has the same key); ValueError "<params.field>: <why>" for a schema that is no JSON or a constraint over a limit."""
    field = params.field
    if params.json is not None:
        schema = _schema_of(params.json, field)
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"{field}: a JSON schema must be an object or a boolean, got {type(schema).__name__}")
        check_constraint_size(field, "json", schema)
        # NOTE: keys keep their order: llguidance writes an object's properties in the order the schema lists them.
        return "json", json.dumps(schema)
    if params.json_object:
        return ("json_object",)
    if params.choice is not None:
        check_constraint_size(field, "choice", params.choice)
        return "choice", tuple(params.choice)
    if params.regex is not None:
        check_constraint_size(field, "regex", params.regex)
        return "regex", params.regex
    assert params.grammar is not None  # StructuredOutputsParams holds exactly one constraint
    check_constraint_size(field, "grammar", params.grammar)
    return "grammar", params.grammar


def grammar_of_key(key: tuple) -> str:
    """llguidance's grammar for a constraint_key (ValueError/TypeError where its front end refuses the source)."""
    kind = key[0]
    matcher = llguidance.LLMatcher
    if kind == "json":
        return matcher.grammar_from_json_schema(key[1], overrides=_JSON_LAYOUT)
    if kind == "json_object":
        return matcher.grammar_from_json_schema(_ANY_JSON_OBJECT, overrides=_JSON_LAYOUT)
    if kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(list(key[1])))
    if kind == "regex":
        return matcher.grammar_from_regex(key[1])
    return matcher.grammar_from_lark(key[1])


def terse_limits() -> "llguidance.LLParserLimits":
    """llguidance's default limits, with short errors: its verbose ones dump the parser's state (tens of ms of the
    engine's time on a large grammar, and the client's schema into the logs)."""
    return llguidance.LLParserLimits(verbose_errors=False)


def _schema_of(schema: Any, field: str) -> Any:
    """The JSON schema, parsed when given as text (a boolean schema arrives as True/False)."""
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except RecursionError:
        raise ValueError(f"{field}: the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels "
                         f"(MAX_SCHEMA_DEPTH)") from None
    except ValueError as error:
        raise ValueError(f"{field}: {error}") from None

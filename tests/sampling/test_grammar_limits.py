"""Structured-output limits (limits.py): each is a ValueError naming the field and the limit, a constraint just inside
each passes, and the depth check follows local $refs (a chain of $defs) but lets a recursive schema through."""

import json

import pytest

from jaxpaged.sampling.grammar import limits
from jaxpaged.sampling.grammar.grammar_source import constraint_key
from jaxpaged.sampling.params import StructuredOutputsParams


def ref_chain(length: int) -> dict:
    """Issue 56's attack: $defs d0..d<length-1>, each an array of the next, ending in an integer."""
    defs: dict[str, dict] = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(length)}
    defs[f"d{length}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_a_ref_chain_is_as_deep_as_its_arrays():
    """A chain of $defs counts as nested as it would be written out: 1,200 links (4 levels as plain dicts) are refused
    for depth even with the $defs count allowed, and a short chain passes."""
    limits.check_schema_limits(ref_chain(20))
    with pytest.raises(ValueError, match=r"^guided_json: the schema is nested deeper than 64 levels \(\$refs "
                                         r"followed; MAX_SCHEMA_DEPTH\)"):
        limits.check_schema_limits(ref_chain(70), "guided_json")


def test_the_issue_s_chain_of_1200_defs_is_refused_naming_the_limit():
    """The 75 KB schema that segfaulted llguidance is refused before any compile, naming the field and the limit."""
    schema = ref_chain(1200)
    assert len(json.dumps(schema)) > 70_000
    with pytest.raises(ValueError, match=r"^structured_outputs.json: the schema holds 1201 \$defs, over the limit "
                                         r"of 1000 \(MAX_SCHEMA_DEFS\)"):
        constraint_key(StructuredOutputsParams(json=schema))


def test_a_recursive_schema_is_not_too_deep():
    """A tree whose nodes refer to themselves (a $ref cycle) is a legal schema: the cycle adds no depth."""
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    limits.check_schema_limits(tree)
    limits.check_schema_limits({"$ref": "#", "type": "array", "items": {"$ref": "#"}})


def test_refs_to_one_schema_from_many_places_cost_one_visit_each():
    """Thirty subschemas each referring to the next twice (2^30 paths, 2 levels a link) are measured at once and
    pass: each target's height is remembered, not walked again per path."""
    defs: dict[str, dict] = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
                             for i in range(30)}
    defs["d30"] = {"type": "integer"}
    limits.check_schema_limits({"$defs": defs, "$ref": "#/$defs/d0"})  # would never return if paths were walked


def test_property_count_limit_counts_every_object():
    """Properties over all objects count together: 1,000 pass, 1,001 (split over two objects) are refused."""
    half = {f"p{i}": {"type": "integer"} for i in range(500)}
    ok = {"type": "object", "properties": {**half, "inner": {"type": "object", "properties": dict(
        list(half.items())[:499])}}}
    limits.check_schema_limits(ok)
    over = {"type": "object", "properties": {**half, "inner": {"type": "object", "properties": half}}}
    with pytest.raises(ValueError, match=r"^tools: the schema declares 1001 properties, over the limit of 1000 "
                                         r"\(MAX_SCHEMA_PROPERTIES\)"):
        limits.check_schema_limits(over, "tools")


def test_choice_count_and_byte_limits_name_the_field():
    """10,000 choices pass and 10,001 are refused; a regex or grammar over MAX_GRAMMAR_BYTES is refused by size."""
    constraint_key(StructuredOutputsParams(choice=[str(i) for i in range(limits.MAX_CHOICES)]))
    with pytest.raises(ValueError, match=r"^guided_choice: 10001 choices exceed the limit of 10000 \(MAX_CHOICES\)"):
        constraint_key(StructuredOutputsParams(choice=[str(i) for i in range(10_001)], origin="guided_choice"))
    with pytest.raises(ValueError, match=r"^structured_outputs.choice: the constraint is 262145 bytes, over the "
                                         r"limit of 262144 bytes \(MAX_GRAMMAR_BYTES\)"):
        constraint_key(StructuredOutputsParams(choice=["a" * 262_145]))
    constraint_key(StructuredOutputsParams(regex="a" * limits.MAX_GRAMMAR_BYTES))
    with pytest.raises(ValueError, match=r"^structured_outputs.grammar: .* \(MAX_GRAMMAR_BYTES\)"):
        constraint_key(StructuredOutputsParams(grammar="start: " + '"é"' * 100_000))


def test_a_schema_over_the_byte_limit_is_refused():
    """A schema whose JSON text is over MAX_GRAMMAR_BYTES (here one long description) is refused by size."""
    with pytest.raises(ValueError, match=r"^response_format: the constraint is \d+ bytes.*MAX_GRAMMAR_BYTES"):
        constraint_key(StructuredOutputsParams(json={"type": "string", "description": "x" * 300_000},
                                               origin="response_format"))

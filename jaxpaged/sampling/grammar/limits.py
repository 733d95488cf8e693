"""Structured-output limits: the sizes a constraint may have before anything compiles it (issue 56).

llguidance's costs grow with the constraint's size (a 60,000-string choice takes seconds to compile, a 10,000-property
object tens of seconds per matcher) and its compiler recurses through `$ref` chains until its stack overflows (a chain
of 1,200 `$defs` segfaults it). Each limit below is far above what a sane request sends; a constraint over one is a
ValueError "<field>: ..." that names the limit, so the server answers 400 before a worker is asked to compile it.
docs/server.md ("Structured-output limits") lists them.
"""

import json
from typing import Any, Optional

MAX_SCHEMA_DEPTH = 64
"""Most levels of nesting (objects and arrays) a JSON schema may have, its local `$ref`s followed: deeper ones are
refused before Python's recursion (a 500) or llguidance's (its stack) meets them. A `$ref` back to a schema already on
the path (a recursive schema such as a tree) is legal and adds nothing."""
MAX_SCHEMA_DEFS = 1_000
"""Most named subschemas (entries of every `$defs` and `definitions`) a JSON schema may hold."""
MAX_SCHEMA_PROPERTIES = 1_000
"""Most `properties` entries a JSON schema may declare, over all its objects. (llguidance itself cannot follow one
object of more than about 450: its parser stops at 2,000 items a row, about 4 a property.)"""
MAX_CHOICES = 10_000
"""Most strings a `choice` constraint may list."""
MAX_GRAMMAR_BYTES = 256 * 1024
"""Most UTF-8 bytes a constraint's source may have: the schema's JSON text, the regex, the Lark grammar, or the
choices together."""


def check_constraint_size(field: str, kind: str, source: Any) -> None:
    """ValueError "<field>: ..." naming the limit if a constraint's source is over one of the limits above.

    kind: "json" (source: the parsed schema), "choice" (a list of str), "regex" or "grammar" (str)."""
    if kind == "choice":
        if len(source) > MAX_CHOICES:
            raise ValueError(f"{field}: {len(source)} choices exceed the limit of {MAX_CHOICES} (MAX_CHOICES)")
        num_bytes = sum(len(choice.encode("utf-8", "surrogatepass")) for choice in source)
    elif kind == "json":
        check_schema_limits(source, field)
        num_bytes = len(json.dumps(source, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    else:
        num_bytes = len(source.encode("utf-8", "surrogatepass"))
    if num_bytes > MAX_GRAMMAR_BYTES:
        raise ValueError(f"{field}: the constraint is {num_bytes} bytes, over the limit of {MAX_GRAMMAR_BYTES} "
                         f"bytes (MAX_GRAMMAR_BYTES)")


def check_schema_limits(schema: Any, field: Optional[str] = None) -> None:
    """ValueError if a parsed JSON schema holds more than MAX_SCHEMA_DEFS named subschemas or MAX_SCHEMA_PROPERTIES
    properties, or nests deeper than MAX_SCHEMA_DEPTH levels with its `$ref`s followed (the message starts with
    "<field>: " when `field` is given)."""
    prefix = f"{field}: " if field else ""
    num_defs = num_properties = 0
    pending = [schema]
    while pending:  # iterative: a wide schema must not recurse
        value = pending.pop()
        if isinstance(value, dict):
            for key, child in value.items():
                if key in ("$defs", "definitions") and isinstance(child, dict):
                    num_defs += len(child)
                elif key == "properties" and isinstance(child, dict):
                    num_properties += len(child)
                pending.append(child)
        elif isinstance(value, list):
            pending.extend(value)
    if num_defs > MAX_SCHEMA_DEFS:
        raise ValueError(f"{prefix}the schema holds {num_defs} $defs, over the limit of {MAX_SCHEMA_DEFS} "
                         f"(MAX_SCHEMA_DEFS)")
    if num_properties > MAX_SCHEMA_PROPERTIES:
        raise ValueError(f"{prefix}the schema declares {num_properties} properties, over the limit of "
                         f"{MAX_SCHEMA_PROPERTIES} (MAX_SCHEMA_PROPERTIES)")
    _DepthWalk(schema, prefix).height(schema, 1)


def check_schema_depth(schema: Any) -> None:
    """ValueError if a parsed JSON schema (or a list of tools holding schemas) nests deeper than MAX_SCHEMA_DEPTH
    levels, its local `$ref`s followed."""
    _DepthWalk(schema, "").height(schema, 1)


class _DepthWalk:
    """Measures a schema's nesting with each local `$ref` ("#/...") replaced by the subschema it points to.

    NOTE: the walk recurses, but it raises as soon as a path is deeper than MAX_SCHEMA_DEPTH, so Python's stack holds
    at most that many frames. Each `$ref` target's height is remembered, so a schema whose subschemas refer to the
    next one twice (2^n paths) costs one visit per subschema, not one per path."""

    def __init__(self, root: Any, prefix: str) -> None:
        self.root = root
        self.prefix = prefix
        self.target_heights: dict[str, int] = {}
        self.refs_on_path: set[str] = set()

    def height(self, value: Any, depth: int) -> int:
        """Levels from `value` (a dict or list at `depth`) down to its deepest container, refs followed."""
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"{self.prefix}the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels "
                             f"($refs followed; MAX_SCHEMA_DEPTH)")
        children = value.values() if isinstance(value, dict) else value
        below = max((self.height(child, depth + 1) for child in children if isinstance(child, (dict, list))),
                    default=0)
        ref = value.get("$ref") if isinstance(value, dict) else None
        if isinstance(ref, str) and ref.startswith("#"):
            # The referenced subschema stands where the $ref is: its levels start at this one.
            below = max(below, self._target_height(ref, depth) - 1)
        return 1 + below

    def _target_height(self, ref: str, depth: int) -> int:
        if ref in self.refs_on_path:
            return 0  # recursion: the schema is infinite by design; the grammar handles it as a loop
        known = self.target_heights.get(ref)
        if known is not None:
            if depth + known - 1 > MAX_SCHEMA_DEPTH:
                self.height({}, MAX_SCHEMA_DEPTH + 1)  # raises the depth error
            return known
        target = _resolve_pointer(self.root, ref)
        if not isinstance(target, (dict, list)):
            return 0  # unknown or scalar: llguidance reports it
        self.refs_on_path.add(ref)
        try:
            known = self.target_heights[ref] = self.height(target, depth)
        finally:
            self.refs_on_path.discard(ref)
        return known


def _resolve_pointer(root: Any, ref: str) -> Any:
    """The value a local JSON pointer ("#/$defs/a", RFC 6901 escapes) names in root; None if it names nothing."""
    value = root
    for token in ref[1:].split("/")[1:] if ref != "#" else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return None
    return value

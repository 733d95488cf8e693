"""22 JSON schemas the structured-output tests run (nested objects, arrays, enums, required and optional fields,
bounded numbers, patterned strings). Strings, arrays and numbers are bounded, so a grammar-following output
always closes within the tests' max_tokens."""

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": NAME}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"],
     "additionalProperties": False},
    {"type": "object", "properties": {"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
     "required": ["city", "zip"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -10, "maximum": 10}, "y": {"type": "integer", "minimum": -10,
                                                                        "maximum": 10}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"name": NAME, "nickname": NAME}, "required": ["name"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
    {"type": "integer", "minimum": 100, "maximum": 999},
    {"type": "boolean"},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": NAME, "admin": {"type": "boolean"}}, "required": ["name", "admin"], "additionalProperties": False},
        "level": {"enum": [1, 2, 3]}}, "required": ["user", "level"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["id"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "done"}, "code": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9}},
     "required": ["status", "code"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]},
    {"type": "object", "properties": {"first": NAME, "last": NAME, "email": {
        "type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}, "required": ["first", "last", "email"],
     "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -50, "maximum": 50}},
     "required": ["temperature"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
        "type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20},
                                      "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                                      "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "sci-fi"]},
                                                 "maxItems": 2}},
     "required": ["title", "year"], "additionalProperties": False},
    {"type": "null"},
]

"""Issue 56's structured-output attacks against a live server: each is answered (a 400 naming the limit and the field,
or a 200) and the server keeps serving the normal request as before.

The $defs chain that segfaulted llguidance comes through every door (structured_outputs.json, response_format,
guided_json, and a tool's parameters under tool_choice required, named and auto); the 60,000-string choice and the
10,000-property schema with n=8 meet their limits; the 90-byte regex that costs seconds to compile is served. A
grammar that crashes the grammar engine (the test hook in the worker's environment) costs only its request.
"""

import pytest

from tests.hostile.live_server import CRASH_REGEX, LiveServer

pytestmark = pytest.mark.xdist_group("hostile")  # the session's hostile_server, started once on one worker


@pytest.fixture
def server(hostile_server) -> LiveServer:
    """The shared live server (tests/hostile/conftest.py): auto tool choice on, the worker's crash hook armed."""
    return hostile_server


def ref_chain(length: int = 1200) -> dict:
    """The 75 KB schema: $defs d0..d1199, each {"type": "array", "items": {"$ref": next}}."""
    defs = {f"d{i}": {"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}} for i in range(length)}
    defs[f"d{length}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def assert_refused(response, param: str, limit: str) -> None:
    """A 400 whose OpenAI error names the field (param and message) and the limit."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ") and limit in error["message"], error


def completion(**extra) -> dict:
    """A short greedy completion body with the attack's fields."""
    return {"prompt": "Answer:", "max_tokens": 8, "temperature": 0, **extra}


def chat(**extra) -> dict:
    """A short chat body with the attack's fields."""
    return {"messages": [{"role": "user", "content": "Call the tool."}], "max_tokens": 8, **extra}


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", dict(structured_outputs={"json": ref_chain()}), "structured_outputs.json"),
    ("/v1/completions", dict(guided_json=ref_chain()), "guided_json"),
    ("/v1/chat/completions", dict(response_format={"type": "json_schema",
                                                   "json_schema": {"name": "chain", "schema": ref_chain()}}),
     "response_format.json_schema.schema"),
], ids=["structured_outputs.json", "guided_json", "response_format"])
def test_the_defs_chain_is_refused_by_the_defs_limit(server, path, body, param):
    """The 1,200-link $defs chain is a 400 naming MAX_SCHEMA_DEFS and the field, before any compile."""
    payload = completion(**body) if path == "/v1/completions" else chat(**body)
    assert_refused(server.post(path, payload), param, "MAX_SCHEMA_DEFS")
    server.assert_still_serving()


@pytest.mark.parametrize("tool_choice, param", [
    ("required", "tools.function.parameters"),
    ({"type": "function", "function": {"name": "deep"}}, "tools.function.parameters"),
    ("auto", "tools"),
], ids=["required", "named", "auto"])
def test_the_defs_chain_as_tool_parameters_is_refused(server, tool_choice, param):
    """The chain as a tool's parameters is a 400 naming MAX_SCHEMA_DEFS whatever tool_choice puts it in a grammar."""
    tools = [{"type": "function", "function": {"name": "deep", "parameters": ref_chain()}}]
    response = server.post("/v1/chat/completions", chat(tools=tools, tool_choice=tool_choice))
    assert_refused(response, param, "MAX_SCHEMA_DEFS")
    server.assert_still_serving()


def test_sixty_thousand_choices_are_refused(server):
    """A 1.3 MB choice of 60,000 strings is a 400 naming MAX_CHOICES (it took 18 s to prepare on the engine loop)."""
    choices = [f"option-{i:05d}-abcdefgh" for i in range(60_000)]
    response = server.post("/v1/completions", completion(structured_outputs={"choice": choices}))
    assert_refused(response, "structured_outputs.choice", "MAX_CHOICES")
    server.assert_still_serving()


def test_ten_thousand_properties_with_n_8_are_refused(server):
    """A 10,000-property object with n=8 (456 s of matcher builds on the engine loop) is a 400 naming
    MAX_SCHEMA_PROPERTIES."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}}
    response = server.post("/v1/completions", completion(n=8, guided_json=schema))
    assert_refused(response, "guided_json", "MAX_SCHEMA_PROPERTIES")
    server.assert_still_serving()


def test_the_exponential_regex_is_served(server):
    """(a{1000}){1000}, 90 bytes whose first mask costs seconds, is compiled off the loop and answered with a's."""
    response = server.post("/v1/completions", completion(structured_outputs={"regex": "(a{1000}){1000}"}))
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["text"]
    assert text and set(text) == {"a"}, text
    server.assert_still_serving()


def test_a_crash_in_the_grammar_engine_costs_only_its_request(server):
    """A grammar worker that dies (the armed crash hook) is a 400 naming the field; the next grammar compiles."""
    response = server.post("/v1/completions", completion(guided_regex=CRASH_REGEX))
    assert_refused(response, "guided_regex", "crashed")
    again = server.post("/v1/completions", completion(guided_choice=["yes", "no"]))
    assert again.status_code == 200 and again.json()["choices"][0]["text"] in ("yes", "no"), again.text
    server.assert_still_serving()

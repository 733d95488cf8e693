"""Structured outputs through the official openai client: response_format (json_schema, json_object) on chat,
vLLM's guided_* extra body on completions; streamed and not. Bad constraints are in test_bad_input.py."""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from tests.json_schemas import SCHEMAS

pytestmark = pytest.mark.xdist_group("server")

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 16},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "languages": {"type": "array", "items": {"enum": ["en", "fr", "de"]}, "minItems": 1, "maxItems": 3}},
    "required": ["name", "age", "languages"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Describe a French person as JSON with name, age and languages."}]


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_format(client, model_name, stream):
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    if stream:
        chunks = client.chat.completions.create(model=model_name, messages=ASK, max_completion_tokens=80,
                                                temperature=0.0, response_format=response_format, stream=True)
        pieces, finish = [], None
        for chunk in chunks:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        text = "".join(pieces)
    else:
        response = client.chat.completions.create(model=model_name, messages=ASK, max_completion_tokens=80,
                                                  temperature=0.0, response_format=response_format)
        text, finish = response.choices[0].message.content, response.choices[0].finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_response_format(client, model_name):
    ask = [{"role": "user", "content": "What is the capital of France? Answer as a JSON object with the key "
                                       "\"capital\"."}]
    response = client.chat.completions.create(model=model_name, messages=ask, max_completion_tokens=200,
                                              temperature=0.0, response_format={"type": "json_object"})
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_guided_choice_and_regex_on_completions(client, model_name, stream):
    body = {"guided_choice": ["positive", "negative"]}
    got = client.completions.create(model=model_name, prompt="Sentiment of 'I love it':", max_tokens=8,
                                    temperature=0.0, extra_body=body, stream=stream)
    text = "".join(c.choices[0].text for c in got) if stream else got.choices[0].text
    assert text in ("positive", "negative")
    got = client.completions.create(model=model_name, prompt="A phone number:", max_tokens=20, temperature=0.0,
                                    extra_body={"guided_regex": r"[0-9]{3}-[0-9]{4}"})
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", got.choices[0].text)


def test_every_schema_streamed_at_once_alongside_unconstrained_requests(client, model_name):
    """The 22 schemas of the engine test, streamed concurrently (one engine batch) with two free-text requests."""

    def stream(schema) -> tuple[str, str]:
        extra = {} if schema is None else {"response_format": {"type": "json_schema",
                                                                "json_schema": {"name": "s", "schema": schema}}}
        ask = [{"role": "user", "content": f"Reply in JSON following this schema: {json.dumps(schema)}"}]
        pieces, finish = [], ""
        for chunk in client.chat.completions.create(model=model_name, messages=ask, max_completion_tokens=160,
                                                    temperature=0.0, stream=True, **extra):
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return "".join(pieces), finish

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(stream, SCHEMAS + [None, None]))
    for schema, (text, finish) in zip(SCHEMAS, results):
        assert finish == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)
    assert all(text for text, _ in results[-2:])

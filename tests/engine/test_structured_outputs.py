"""Structured outputs through LLM on the embedded model: JSON schemas, json_object, regex, choice and grammars,
greedy and sampled, mixed in one batch with unconstrained requests; every output validates, nothing recompiles."""

import json
import re

import jsonschema
import pytest

from jaxpaged.sampling.params import SamplingParams, StructuredOutputsParams
from tests.json_schemas import SCHEMAS
from tests.lazy_compile import warmed_up_as_served
from tests.server.server_helpers import SERVER_ENGINE_OPTIONS

# One worker builds the engine (it compiles) for every test here.
pytestmark = pytest.mark.xdist_group("structured_outputs")

# The server tests' session engine's options (the embedded model, its default pool): the same programs, so whichever
# of the two is built second loads its 23 from the session's XLA cache (a 400-block pool compiled all 23 again).
OPTIONS = SERVER_ENGINE_OPTIONS

@pytest.fixture(scope="module")
def llm():
    from jaxpaged.llm import LLM

    with warmed_up_as_served():  # a test counts compiles while serving
        return LLM(None, **OPTIONS)


def constrained(schema, *, temperature=0.0, seed=None, max_tokens=160):
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens,
                          structured_outputs=StructuredOutputsParams(json=schema))


def chat_prompt(llm, text: str) -> str:
    return llm.get_tokenizer().apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                   add_generation_prompt=True)


def test_json_schemas_greedy_and_sampled_mixed_with_unconstrained(llm):
    before = llm.engine.get_stats().num_compilations
    prompts, params = [], []
    for index, schema in enumerate(SCHEMAS):
        prompt = chat_prompt(llm, f"Reply in JSON following this schema: {json.dumps(schema)}")
        prompts += [prompt, prompt]
        params += [constrained(schema), constrained(schema, temperature=0.9, seed=index)]
    free_prompt = chat_prompt(llm, "Tell me about the sea.")
    prompts += [free_prompt, free_prompt]
    free = [SamplingParams(temperature=0.0, max_tokens=24), SamplingParams(temperature=0.9, seed=5, max_tokens=24)]
    params += free
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for index, schema in enumerate(SCHEMAS):
        for out in outputs[2 * index:2 * index + 2]:
            completion = out.outputs[0]
            assert completion.finish_reason == "stop", (schema, completion.text)
            jsonschema.validate(json.loads(completion.text), schema)
    # The unconstrained rows are exactly what they are alone: the masks of their neighbours never touch them.
    alone = llm.generate([free_prompt, free_prompt], free, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs[-2:]] == [o.outputs[0].token_ids for o in alone]
    assert llm.engine.get_stats().num_compilations == before


@pytest.mark.parametrize("constraint, check", [
    (StructuredOutputsParams(json_object=True), lambda text: isinstance(json.loads(text), dict)),
    (StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,4}"), lambda text: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text)),
    (StructuredOutputsParams(choice=["Paris", "London", "Berlin"]), lambda text: text in ("Paris", "London",
                                                                                           "Berlin")),
    (StructuredOutputsParams(grammar='start: "The answer is " NUM "."\nNUM: /[0-9]{1,3}/'),
     lambda text: re.fullmatch(r"The answer is [0-9]{1,3}\.", text)),
])
def test_other_constraint_kinds(llm, constraint, check):
    params = SamplingParams(temperature=0.0, max_tokens=64, structured_outputs=constraint)
    out = llm.generate(chat_prompt(llm, "What is the capital of France? Answer in JSON."), params,
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and check(out.text), out.text


def test_n_samples_get_independent_matchers_copied_from_one_compile(llm):
    """n=2 sampled under one regex: the grammar compiles once (one worker compile), each sample's matcher is its own
    copy, and both outputs are whole, valid and (seeded sampling over 26^6 strings) different."""
    pattern = r"[a-z]{6}"
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=32,
                            structured_outputs=StructuredOutputsParams(regex=pattern))
    num_compiles = llm.engine.grammars.pool.num_compiles
    outputs = llm.generate("Write a word:", params, use_tqdm=False)[0].outputs
    assert llm.engine.grammars.pool.num_compiles == num_compiles + 1
    texts = [out.text for out in outputs]
    assert all(out.finish_reason == "stop" and re.fullmatch(pattern, out.text) for out in outputs), texts
    assert texts[0] != texts[1]


@pytest.mark.parametrize("constraint, field", [
    (StructuredOutputsParams(json={"type": "objekt"}), "structured_outputs.json"),
    (StructuredOutputsParams(json="{not json"), "structured_outputs.json"),
    (StructuredOutputsParams(regex="a(b"), "structured_outputs.regex"),
    (StructuredOutputsParams(grammar="start: foo"), "structured_outputs.grammar"),
    (StructuredOutputsParams(json={"type": "integer", "minimum": 5, "maximum": 2}, origin="guided_json"),
     "guided_json"),
])
def test_an_invalid_constraint_is_refused_at_admission_and_the_engine_keeps_serving(llm, constraint, field):
    params = SamplingParams(max_tokens=4, structured_outputs=constraint)
    with pytest.raises(ValueError, match=rf"^{re.escape(field)}: "):
        llm.engine.add_request("bad-grammar", "Hello", params)
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def test_structured_outputs_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="^structured_outputs: must set exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="^structured_outputs: must set exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="^structured_outputs.choice: must be a non-empty list"):
        StructuredOutputsParams(choice=[])

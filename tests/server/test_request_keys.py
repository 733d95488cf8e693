"""Each sampling and prompt key of the OpenAI and vLLM request surface reaches the engine's SamplingParams or
prompt unchanged (tests/sampling checks what the sampler does with them); no engine, no server."""

import asyncio

import pytest

from jaxpaged.sampling.params import StructuredOutputsParams
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.prompts import completion_prompts
from jaxpaged.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from jaxpaged.server.openai.validation import build_sampling_params, structured_outputs_of

VOCAB_SIZE = 1000
SAMPLING_KEYS = {"n": 2, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 11,
                 "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
                 "stop": ["END"], "stop_token_ids": [7, 8], "include_stop_str_in_output": True, "min_tokens": 3,
                 "ignore_eos": True, "skip_special_tokens": False}
"""Keys whose value SamplingParams keeps as the request gave it, each set away from its default."""


class _Tokenizer:
    def encode(self, text, add_special_tokens=True):
        return [ord(char) % VOCAB_SIZE for char in text]


@pytest.mark.parametrize("request_type, prompt", [(CompletionRequest, {"prompt": "Hi"}),
                                                  (ChatCompletionRequest,
                                                   {"messages": [{"role": "user", "content": "Hi"}]})])
def test_sampling_keys_reach_the_sampling_params_on_both_endpoints(request_type, prompt):
    request = request_type.model_validate({**prompt, **SAMPLING_KEYS, "logit_bias": {"5": -2.5}})
    params = build_sampling_params(request, max_tokens=9, logprobs=None, vocab_size=VOCAB_SIZE, max_n=4)
    assert {key: getattr(params, key) for key in SAMPLING_KEYS} == SAMPLING_KEYS
    assert params.logit_bias == {5: -2.5} and params.max_tokens == 9


@pytest.mark.parametrize("key, value, expected", [
    ("guided_json", {"type": "integer"}, StructuredOutputsParams(json={"type": "integer"})),
    ("guided_regex", "[ab]+", StructuredOutputsParams(regex="[ab]+")),
    ("guided_choice", ["yes", "no"], StructuredOutputsParams(choice=["yes", "no"])),
    ("guided_grammar", 'start: "a"', StructuredOutputsParams(grammar='start: "a"')),
])
def test_vllm_guided_keys_are_the_structured_output_of_the_same_kind(key, value, expected):
    constraint = structured_outputs_of(CompletionRequest.model_validate({"prompt": "x", key: value}))
    assert constraint is not None
    assert (constraint.json, constraint.regex, constraint.choice, constraint.grammar) == \
        (expected.json, expected.regex, expected.choice, expected.grammar)


def test_cache_salt_and_priority_reach_every_prompt_of_a_batch():
    request = CompletionRequest.model_validate({"prompt": ["a", "b"], "cache_salt": "tenant-a", "priority": -3})
    prompts = asyncio.run(completion_prompts(request, _Tokenizer(), VOCAB_SIZE))
    assert [(prompt.cache_salt, prompt.priority) for prompt in prompts] == [("tenant-a", -3)] * 2


def test_n_over_the_servers_max_n_is_a_400_naming_n():
    request = CompletionRequest.model_validate({"prompt": "x", "n": 5})
    with pytest.raises(APIError) as refused:
        build_sampling_params(request, max_tokens=4, logprobs=None, vocab_size=VOCAB_SIZE, max_n=4)
    assert (refused.value.status_code, refused.value.param) == (400, "n") and "--max-n" in refused.value.message

"""vLLM's truncate_prompt_tokens: the prompt's last k tokens run (left truncation), on both endpoints; -1 keeps the
last max_model_len; anything else is a 400 naming the key."""

import openai
import pytest

from jaxpaged.inputs import ParsedPrompt
from jaxpaged.server.openai.prompt_truncation import truncated

pytestmark = pytest.mark.xdist_group("server")

PROMPT = "The capital of France is a city on the Seine"


def test_truncation_keeps_the_last_tokens():
    """Hand-worked: [1..6] keeping 3 is [4, 5, 6]; -1 keeps max_model_len; a short prompt is unchanged."""
    prompt = ParsedPrompt(text="t", token_ids=[1, 2, 3, 4, 5, 6])
    assert truncated(prompt, 3, 100).token_ids == [4, 5, 6] and truncated(prompt, 3, 100).text is None
    assert truncated(prompt, -1, 4).token_ids == [3, 4, 5, 6]
    assert truncated(prompt, 10, 100) is prompt and truncated(prompt, None, 2) is prompt


def test_a_truncated_completion_runs_the_prompt_s_last_tokens(client, http, model_name):
    """truncate_prompt_tokens=3 answers as the last 3 token ids sent alone (greedy), and counts 3 prompt tokens."""
    token_ids = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert len(token_ids) > 3
    truncated_run = client.completions.create(model=model_name, prompt=PROMPT, max_tokens=4, temperature=0.0,
                                              extra_body={"truncate_prompt_tokens": 3})
    tail_run = client.completions.create(model=model_name, prompt=token_ids[-3:], max_tokens=4, temperature=0.0)
    assert truncated_run.choices[0].text == tail_run.choices[0].text
    assert truncated_run.usage.prompt_tokens == 3


def test_a_truncated_chat_counts_the_kept_tokens(client, model_name):
    """On chat the rendered prompt is truncated from the left too."""
    response = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=2, extra_body={"truncate_prompt_tokens": 5})
    assert response.usage.prompt_tokens == 5


@pytest.mark.parametrize("value", [0, -2, 1.5, "3", True])
def test_a_bad_truncation_is_a_400_naming_the_key(client, model_name, value):
    """Only an int >= 1 or -1."""
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=model_name, prompt=PROMPT, max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": value})
    body = error.value.body
    assert isinstance(body, dict) and body["param"] == "truncate_prompt_tokens"

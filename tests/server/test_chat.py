"""POST /v1/chat/completions through the official openai client: template, n, logprobs, usage, streaming."""

import math

import pytest

pytestmark = pytest.mark.xdist_group("server")

MESSAGES = [{"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": "What is the capital of France?"}]


def test_chat_n2_usage_matches_template(client, http, model_name):
    """Usage counts the chat-template prompt (as /tokenize renders it) and every choice's tokens."""
    result = client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=10, n=2,
                                            temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    assert result.object == "chat.completion"
    assert sorted(choice.index for choice in result.choices) == [0, 1]
    assert all(choice.message.role == "assistant" and choice.finish_reason == "length" for choice in result.choices)
    num_prompt = http.post("/tokenize", json={"messages": MESSAGES}).json()["count"]
    assert result.usage.prompt_tokens == num_prompt
    assert result.usage.completion_tokens == 20
    assert result.usage.total_tokens == num_prompt + 20


def test_chat_greedy_answer(client, model_name):
    """The embedded instruct model answers the question (greedy) and stops by itself (EOS)."""
    result = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=16, temperature=0.0)
    choice = result.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"


def test_chat_logprobs(client, model_name):
    """logprobs + top_logprobs=3: per token, its text, bytes and the 3 best alternatives; greedy picks the best."""
    result = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=6, temperature=0.0,
                                            logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = result.choices[0].logprobs.content
    assert len(content) == 6 == result.usage.completion_tokens
    for item in content:
        assert bytes(item.bytes).decode("utf-8", errors="replace") == item.token
        assert len(item.top_logprobs) == 3
        assert math.isclose(item.logprob, item.top_logprobs[0].logprob, abs_tol=1e-5)
        ranked = [alt.logprob for alt in item.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)


def test_chat_without_logprobs_has_none(client, model_name):
    """No logprobs asked for, none returned."""
    result = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=2)
    assert result.choices[0].logprobs is None


def test_chat_stream_matches_non_stream(client, model_name):
    """A role chunk first, then content deltas that add up to the non-streamed answer, then usage."""
    kwargs = dict(model=model_name, messages=MESSAGES, max_tokens=12, temperature=0.0)
    whole_result = client.chat.completions.create(**kwargs)
    whole = whole_result.choices[0]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [chunk for chunk in chunks if chunk.choices]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in content_chunks) == whole.message.content
    assert content_chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole_result.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole_result.usage.prompt_tokens
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)


def test_chat_stream_n2_logprobs(client, model_name):
    """Streaming with n=2 and logprobs: each choice gets its role chunk, its tokens' logprobs and a finish."""
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, n=2,
                                                 stream=True, logprobs=True, top_logprobs=1,
                                                 extra_body={"ignore_eos": True}))
    for index in (0, 1):
        mine = [chunk.choices[0] for chunk in chunks if chunk.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert sum(len(choice.logprobs.content) for choice in mine if choice.logprobs) == 5
        assert mine[-1].finish_reason == "length"


def test_max_completion_tokens_wins(client, model_name):
    """max_completion_tokens (OpenAI's newer name) takes precedence over max_tokens."""
    result = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=9,
                                            max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert result.usage.completion_tokens == 3


def test_content_parts_equal_plain_text(client, model_name):
    """A content list of text parts renders like the same text as a string."""
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
    plain = [{"role": "user", "content": "What is the capital of France?"}]
    a = client.chat.completions.create(model=model_name, messages=parts, max_tokens=4, temperature=0.0)
    b = client.chat.completions.create(model=model_name, messages=plain, max_tokens=4, temperature=0.0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens

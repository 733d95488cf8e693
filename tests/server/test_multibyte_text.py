"""Greedy outputs in CJK, Hangul, emoji and accented Latin that end in the middle of a character (max_tokens, a
stop string): the text never ends in U+FFFD, and streamed deltas, the non-streamed response and the engine's
own output (what LLM.generate returns) hold the same text and the same logprob token strings."""

import asyncio
import itertools
from typing import Optional

import pytest
from openai.types.chat.chat_completion import Choice

from jaxpaged.outputs import CompletionOutput
from jaxpaged.sampling.params import SamplingParams

pytestmark = pytest.mark.xdist_group("server")

REPLACEMENT = "\ufffd"
JA = "日本の首都は東京です。中国の首都は"  # greedy: 'アネットアップ…', two byte tokens per katakana
KO = "한국의 수도는 서울입니다. 일본의 수도는"  # greedy: ' 서울입니다.', ' 서' begins with the token b' \xec'
PL = "Łódź jest miastem w Polsce. Kraków jest"  # greedy: ' więcą,', 'ą' is two byte tokens
EMOJI = "Send me three emoji that show you are happy."  # chat, greedy: '👌🏰👌🏰', three byte tokens each
ZH = "用中文回答：中国的首都是哪里？"  # chat, greedy: '中国的首都是哪', '首' is three byte tokens

_request_ids = itertools.count()


def engine_output(async_engine, prompt_ids: list[int], params: SamplingParams) -> list[CompletionOutput]:
    """The engine's final outputs for the prompt: token ids and the text LLM.generate would return."""
    async def run():
        final = None
        async for output in async_engine.add_request(f"multibyte-ref-{next(_request_ids)}",
                                                     {"prompt_token_ids": prompt_ids}, params):
            final = output
        assert final is not None  # the request yields at least its final output
        return sorted(final.outputs, key=lambda sample: sample.index)
    return asyncio.run(run())


def check_against_the_engine(async_engine, prompt_ids: list[int], params: SamplingParams, text: str,
                             cut_mid_character: bool) -> CompletionOutput:
    """The server's text equals the engine's, which is the decoded ids less an incomplete last character."""
    (sample,) = engine_output(async_engine, prompt_ids, params)
    assert sample.text == text
    assert len(sample.token_ids) <= params.max_tokens
    decoded = async_engine.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
    assert decoded.endswith(REPLACEMENT) == cut_mid_character, decoded  # the case really cuts (or not)
    if sample.stop_reason is None:
        assert sample.text == decoded.rstrip(REPLACEMENT)
    return sample


def completion_both_ways(client, model_name, prompt: str, **kwargs) -> tuple[list, dict[int, str], dict[int, list]]:
    """Non-streamed choices, and per index the streamed text and logprob token strings."""
    kwargs = {"model": model_name, "prompt": prompt, "temperature": 0.0, "logprobs": 1, **kwargs}
    result = client.completions.create(**kwargs)
    assert result.usage.completion_tokens == sum(len(choice.logprobs.tokens) for choice in result.choices)
    whole = sorted(result.choices, key=lambda choice: choice.index)
    texts, tokens, finishes = {}, {}, {}
    for chunk in client.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        tokens.setdefault(choice.index, []).extend(choice.logprobs.tokens if choice.logprobs else [])
        finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert finishes == {choice.index: choice.finish_reason for choice in whole}
    return whole, texts, tokens


@pytest.mark.parametrize("prompt,max_tokens,expected", [
    (JA, 5, "アネ"), (KO, 5, " 서"), (PL, 5, " więc"), (KO, 1, " ")], ids=["ja", "ko", "pl", "ko-space"])
def test_completion_cut_mid_character_by_max_tokens(client, http, async_engine, model_name, prompt, max_tokens,
                                                    expected):
    """max_tokens ends inside a character: its bytes are dropped alike streamed and not; every token counts."""
    whole, texts, tokens = completion_both_ways(client, model_name, prompt, max_tokens=max_tokens)
    choice = whole[0]
    assert choice.text == texts[0] == expected
    assert choice.finish_reason == "length"
    assert choice.logprobs.tokens == tokens[0] and len(tokens[0]) == max_tokens  # usage counts these too
    assert tokens[0][-1].endswith(REPLACEMENT)  # a token string is its own decode, as vLLM reports it
    prompt_ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    check_against_the_engine(async_engine, prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                             choice.text, cut_mid_character=True)


@pytest.mark.parametrize("include", [False, True], ids=["cut", "included"])
@pytest.mark.parametrize("prompt,stop,max_tokens,cuts,finish_reason,expected,expected_with_stop", [
    # Cut inside the stop string's own last character: no stop yet, the whole characters before it show.
    (JA, "ット", 7, True, "length", "アネッ", "アネッ"),
    # Stopped once the stop string's last character is complete.
    (JA, "ット", 14, False, "stop", "アネ", "アネット"),
    (JA, "ネ", 14, False, "stop", "ア", "アネ"),
    # ' ' arrives in one token with the first byte of '서': it waits for '서', which max_tokens cuts off, and
    # still stops the text.
    (KO, " ", 2, True, "stop", "", " "),
], ids=["ja-cut-in-stop", "ja-stop", "ja-stop-one-char", "ko-stop-held-by-partial"])
def test_completion_with_a_stop_string_and_a_partial_character(client, http, async_engine, model_name, prompt,
                                                               stop, max_tokens, cuts, finish_reason, expected,
                                                               expected_with_stop, include):
    """Stop strings (with and without include_stop_str_in_output) next to a cut character: same text both ways."""
    whole, texts, tokens = completion_both_ways(client, model_name, prompt, max_tokens=max_tokens, stop=[stop],
                                                extra_body={"include_stop_str_in_output": include})
    choice = whole[0]
    assert choice.text == texts[0] == (expected_with_stop if include else expected)
    assert choice.finish_reason == finish_reason
    assert choice.model_extra["stop_reason"] == (stop if finish_reason == "stop" else None)
    assert choice.logprobs.tokens == tokens[0]
    prompt_ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=[stop], include_stop_str_in_output=include)
    sample = check_against_the_engine(async_engine, prompt_ids, params, choice.text, cut_mid_character=cuts)
    assert sample.finish_reason == finish_reason


@pytest.mark.parametrize("seed,temperature", [(None, 0.0), (11, 0.8)], ids=["greedy", "seeded"])
def test_completion_n3_each_choice_the_same_both_ways(client, http, async_engine, model_name, seed, temperature):
    """n=3 (greedy, and seeded sampling): each choice's streamed text and tokens equal its non-streamed ones."""
    whole, texts, tokens = completion_both_ways(client, model_name, JA, max_tokens=5, n=3, seed=seed,
                                                temperature=temperature)
    assert [choice.index for choice in whole] == [0, 1, 2]
    assert [choice.text for choice in whole] == [texts[i] for i in range(3)]
    assert [choice.logprobs.tokens for choice in whole] == [tokens[i] for i in range(3)]
    assert not any(REPLACEMENT in choice.text for choice in whole)
    if seed is None:
        assert [choice.text for choice in whole] == ["アネ"] * 3


def chat_both_ways(client, model_name, content: str, **kwargs) -> tuple[Choice, str, list[str], Optional[str]]:
    """The non-streamed choice, and the streamed content, logprob token strings and finish reason."""
    kwargs = {"model": model_name, "messages": [{"role": "user", "content": content}], "temperature": 0.0,
              "logprobs": True, "top_logprobs": 1, **kwargs}
    whole = client.chat.completions.create(**kwargs).choices[0]
    text, tokens, finish_reason = "", [], None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        tokens += [item.token for item in choice.logprobs.content] if choice.logprobs else []
        finish_reason = choice.finish_reason or finish_reason
    assert finish_reason == whole.finish_reason
    return whole, text, tokens, finish_reason


@pytest.mark.parametrize("content,max_tokens,stop,include,expected", [
    (EMOJI, 5, None, False, "👌"), (ZH, 6, None, False, "中国的"),
    (EMOJI, 14, ["🏰👌"], False, "👌"), (EMOJI, 14, ["🏰👌"], True, "👌🏰👌"),
    (ZH, 14, ["首都"], False, "中国的"), (ZH, 14, ["首都"], True, "中国的首都"),
], ids=["emoji", "zh", "emoji-stop", "emoji-stop-included", "zh-stop", "zh-stop-included"])
def test_chat_cut_mid_character(client, http, async_engine, model_name, content, max_tokens, stop, include,
                                expected):
    """Chat, by max_tokens and by an emoji or CJK stop string: the content and logprob tokens agree both ways."""
    whole, text, tokens, finish_reason = chat_both_ways(client, model_name, content, max_tokens=max_tokens,
                                                        stop=stop, extra_body={"include_stop_str_in_output": include})
    assert whole.message.content == text == expected
    assert whole.logprobs is not None and whole.logprobs.content is not None  # logprobs were asked for
    assert [item.token for item in whole.logprobs.content] == tokens
    assert finish_reason == ("length" if stop is None else "stop")
    if stop is None:
        assert len(tokens) == max_tokens and tokens[-1] == REPLACEMENT  # that token is part of a character
        prompt_ids = http.post("/tokenize", json={"messages": [{"role": "user", "content": content}]}).json()["tokens"]
        check_against_the_engine(async_engine, prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                 text, cut_mid_character=True)

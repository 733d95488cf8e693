"""LLM.generate on outputs that end in the middle of a multi-byte character (emoji, CJK, accented Latin), by
max_tokens, a stop string or a stop token: the text never ends in U+FFFD, token_ids keep every token, and the
text and logprob token strings equal what a caller stepping the engine sees streamed.

The tiny random model is made to spell a word's tokens over and over, deterministically, at temperature 0:
logit_bias puts the word's k tokens far above the rest, falling by BIAS_STEP in word order; the repetition
penalty divides a used token's logit by REPETITION (its bias/REPETITION still beats every unbiased token), so
unused word tokens come first, in order; the frequency penalty (2 per use) then makes the least used, earliest
token win, so the word repeats. The spacing (BIAS_STEP / REPETITION) * (k - 1) < 2 keeps that order, and
BIAS_STEP is far above the gaps between the tiny model's own (near-zero, random-init) logits."""

import itertools

import pytest

from jaxpaged.outputs import CompletionOutput
from jaxpaged.sampling.params import SamplingParams

# One worker builds the shared tiny engine (it compiles) for every test that uses it.
pytestmark = pytest.mark.xdist_group("tiny_llm")

REPLACEMENT = "\ufffd"
PROMPT = "Say it:"
BIAS_STEP = 2.0
REPETITION = 4.0
# Three byte tokens each, the first of them only part of a character.
WORDS = {"emoji": "👌", "cjk": "日本", "latin": "Łó", "latin2": "Ça"}
_request_ids = itertools.count()


def spelling(tokenizer, word: str, **kwargs) -> tuple[SamplingParams, list[int]]:
    """Greedy params under which the tiny model outputs word's tokens repeated; and those tokens."""
    word_ids = tokenizer.encode(word)
    assert len(set(word_ids)) == len(word_ids) <= 4 and not set(word_ids) & set(tokenizer.encode(PROMPT))
    bias = {token_id: 100.0 - BIAS_STEP * position for position, token_id in enumerate(word_ids)}
    params = SamplingParams(temperature=0.0, logit_bias=bias, repetition_penalty=REPETITION, frequency_penalty=2.0,
                            ignore_eos=True, **kwargs)
    return params, word_ids


def streamed(llm, params: SamplingParams) -> dict[int, CompletionOutput]:
    """Steps the engine as a streaming caller does, checking each sample's text only grows; the last outputs."""
    request_id = f"multibyte-stream-{next(_request_ids)}"
    llm.engine.add_request(request_id, PROMPT, params)
    last: dict[int, CompletionOutput] = {}
    while llm.engine.has_unfinished_requests():
        for output in llm.engine.step():
            for sample in output.outputs:
                if sample.index in last:
                    assert sample.text.startswith(last[sample.index].text)  # so deltas add up to the text
                last[sample.index] = sample
    return last


def generate_both_ways(llm, params: SamplingParams) -> list[CompletionOutput]:
    """LLM.generate's samples, checked equal to the streamed ones: text, ids, finish, logprob strings."""
    generated = sorted(llm.generate(PROMPT, params, use_tqdm=False)[0].outputs, key=lambda sample: sample.index)
    last = streamed(llm, params)
    assert sorted(last) == [sample.index for sample in generated]
    for sample in generated:
        other = last[sample.index]
        assert (sample.text, sample.token_ids) == (other.text, other.token_ids)
        assert (sample.finish_reason, sample.stop_reason) == (other.finish_reason, other.stop_reason)
        assert REPLACEMENT not in sample.text
        if params.logprobs is not None:
            assert sample.logprobs is not None and other.logprobs is not None
            assert [{i: lp.decoded_token for i, lp in entry.items()} for entry in sample.logprobs] \
                == [{i: lp.decoded_token for i, lp in entry.items()} for entry in other.logprobs]
    return generated


@pytest.mark.parametrize("word", WORDS.values(), ids=WORDS.keys())
def test_cut_by_max_tokens(tiny_llm, word):
    """Two words and one token of the third: the text is the two words; all 7 tokens are counted. Logprob
    strings are each token's own decode, U+FFFD for a part of a character (as vLLM reports them)."""
    tokenizer = tiny_llm.get_tokenizer()
    params, word_ids = spelling(tokenizer, word, max_tokens=7, n=2, logprobs=1)
    for sample in generate_both_ways(tiny_llm, params):
        assert sample.token_ids == (word_ids * 3)[:7]  # the spelling worked
        assert tokenizer.decode(sample.token_ids).endswith(REPLACEMENT)
        assert sample.text == word * 2 and sample.finish_reason == "length"
        assert sample.logprobs is not None  # logprobs=1
        assert [entry[token_id].decoded_token for entry, token_id in zip(sample.logprobs, sample.token_ids)] \
            == [tokenizer.decode([token_id]) for token_id in sample.token_ids]


@pytest.mark.parametrize("include", [False, True], ids=["cut", "included"])
@pytest.mark.parametrize("stop,max_tokens,finish_reason,expected,expected_included", [
    # 日本日 + the first byte token of 本日's 日: the stop string is cut inside its last character.
    ("本日", 4, "length", "日本", "日本"),
    ("本日", 8, "stop", "日", "日本日"),
    ("日本日本", 4, "length", "日本", "日本"),  # the stop string's start is held, then released whole
], ids=["cut-in-stop", "stop", "held-stop-start"])
def test_cut_at_a_stop_string(tiny_llm, stop, max_tokens, finish_reason, expected, expected_included, include):
    """A CJK stop string, with and without include_stop_str_in_output, cut mid-character or matched."""
    params, _ = spelling(tiny_llm.get_tokenizer(), WORDS["cjk"], max_tokens=max_tokens, stop=[stop],
                         include_stop_str_in_output=include)
    (sample,) = generate_both_ways(tiny_llm, params)
    assert sample.text == (expected_included if include else expected)
    assert sample.finish_reason == finish_reason
    assert sample.stop_reason == (stop if finish_reason == "stop" else None)


@pytest.mark.parametrize("include,expected", [(False, "本"), (True, "本日")], ids=["cut", "included"])
def test_a_stop_token_that_ends_a_character(tiny_llm, include, expected):
    """The stop token is the last byte token of 日: left out, the byte before it never shows as text."""
    tokenizer = tiny_llm.get_tokenizer()
    params, word_ids = spelling(tokenizer, "本日", max_tokens=8, include_stop_str_in_output=include)
    params.stop_token_ids = [word_ids[-1]]
    (sample,) = generate_both_ways(tiny_llm, params)
    assert sample.token_ids == word_ids and tokenizer.decode(word_ids[:-1]).endswith(REPLACEMENT)
    assert sample.finish_reason == "stop" and sample.stop_reason == word_ids[-1]
    assert sample.text == expected

"""IncrementalDetokenizer on the embedded model's real byte-level BPE tokenizer: split UTF-8, stop strings,
special tokens, and a cost per token that does not grow with the output."""

import pytest

from jaxpaged.engine.detokenizer import IncrementalDetokenizer

PROMPT = "<|im_start|>user\nSay something 世<|im_end|>\n<|im_start|>assistant\n"
TEXTS = [
    "The answer is 42. END of story.",
    "Hello 世界 🎉🎉 naïve café, Привет! Ω≈ç√ — done.",
    "日本語のテキスト",
    "def f(x):\n    return x  # ok\n",
    "🎉",
]


def stream(detokenizer: IncrementalDetokenizer, token_ids, chunk_size: int = 1) -> list[str]:
    """Feeds ids chunk by chunk, then finish(); returns every released delta."""
    deltas = [detokenizer.add_tokens(token_ids[i:i + chunk_size]) for i in range(0, len(token_ids), chunk_size)]
    return deltas + [detokenizer.finish()]


@pytest.mark.parametrize("chunk_size", [1, 3])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_the_full_decode(smollm2_tokenizer, text, chunk_size):
    """The deltas add up to tokenizer.decode(all ids), and no delta carries a half character (U+FFFD)."""
    tok = smollm2_tokenizer
    ids = tok.encode(text)
    detokenizer = IncrementalDetokenizer(tok, tok.encode(PROMPT))
    deltas = stream(detokenizer, ids, chunk_size)
    assert "".join(deltas) == detokenizer.output_text == tok.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_a_character_split_over_three_tokens_comes_out_whole(smollm2_tokenizer):
    """'🎉' is three byte tokens: nothing is released until the third, then the whole character."""
    tok = smollm2_tokenizer
    ids = tok.encode("Party 🎉 time")
    assert [tok.decode([i]) for i in ids[2:5]] == [" \ufffd", "\ufffd", "\ufffd"]  # the split this test needs
    detokenizer = IncrementalDetokenizer(tok, [])
    assert stream(detokenizer, ids) == ["Part", "y", "", "", " 🎉", " time", ""]


def test_undecodable_bytes_at_the_end_are_dropped_by_finish(smollm2_tokenizer):
    """A lone UTF-8 continuation byte is held while it might complete; at the end it is dropped, not U+FFFD."""
    tok = smollm2_tokenizer
    lone_byte = tok.convert_tokens_to_ids("ĸ")  # byte 0xB8: can only continue a character
    detokenizer = IncrementalDetokenizer(tok, [])
    assert detokenizer.add_tokens(tok.encode("Hello")) == "Hello"
    assert detokenizer.add_tokens([lone_byte]) == ""
    assert detokenizer.finish() == ""
    assert detokenizer.output_text == "Hello"


def test_undecodable_bytes_followed_by_text_stay_as_u_fffd(smollm2_tokenizer):
    """Only the end is trimmed: bytes that never became a character, then more text, read as U+FFFD (vLLM too)."""
    tok = smollm2_tokenizer
    lone_byte = tok.convert_tokens_to_ids("ĸ")
    detokenizer = IncrementalDetokenizer(tok, [])
    deltas = stream(detokenizer, tok.encode("Hello") + [lone_byte] + tok.encode(" world"))
    assert "".join(deltas) == detokenizer.output_text == "Hello\ufffd world"


def test_prompt_text_never_leaks_into_the_output(smollm2_tokenizer):
    """The prompt tail is only decoding context: the first delta is the first output token's text."""
    tok = smollm2_tokenizer
    detokenizer = IncrementalDetokenizer(tok, tok.encode("Hello"))
    assert detokenizer.add_tokens(tok.encode(" world")) == " world"
    assert detokenizer.output_text == " world"


def _tokens_of(tok, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok.encode(text)]


@pytest.mark.parametrize("stop,include,expected", [
    ("42. END", False, "The answer is "),
    ("42. END", True, "The answer is 42. END"),
    ("swer is", False, "The an"),
    ("ND o", True, "The answer is 42. END o"),
    (". END of", False, "The answer is 42"),
])
def test_stop_strings_spanning_tokens(smollm2_tokenizer, stop, include, expected):
    """A stop string over several tokens (and starting or ending mid-token) truncates the text exactly."""
    tok = smollm2_tokenizer
    text = "The answer is 42. END of story."
    assert not any(stop in token for token in _tokens_of(tok, text))  # it really spans tokens
    detokenizer = IncrementalDetokenizer(tok, [], stop=[stop], include_stop_str_in_output=include)
    deltas = stream(detokenizer, tok.encode(text))
    assert detokenizer.output_text == "".join(deltas) == expected
    assert detokenizer.stop_string == stop
    assert detokenizer.finished and detokenizer.add_tokens(tok.encode(" more")) == ""
    assert detokenizer.output_text == expected


def test_text_is_held_back_only_while_a_stop_string_may_be_forming(smollm2_tokenizer):
    """With stop 'ABCDEF', 'ABC' and 'ABCDE' are held; the token that rules the stop out releases them."""
    tok = smollm2_tokenizer
    ids = tok.encode("x ABCDE yy")
    assert [tok.decode([i]) for i in ids] == ["x", " ABC", "DE", " y", "y"]  # the split this test needs
    detokenizer = IncrementalDetokenizer(tok, [], stop=["ABCDEF"])
    released_after_each = []
    for token_id in ids:
        detokenizer.add_tokens([token_id])
        released_after_each.append(detokenizer.output_text)
    assert released_after_each == ["x", "x ", "x ", "x ABCDE y", "x ABCDE yy"]
    assert detokenizer.finish() == ""
    assert detokenizer.output_text == "x ABCDE yy" and detokenizer.stop_string is None


def test_finish_releases_a_held_back_stop_prefix(smollm2_tokenizer):
    """Text ending in the start of a stop string is released when the completion ends for another reason."""
    tok = smollm2_tokenizer
    detokenizer = IncrementalDetokenizer(tok, [], stop=["</answer>"])
    deltas = [detokenizer.add_tokens([i]) for i in tok.encode("It is 4</ans")]
    assert detokenizer.output_text == "It is 4"
    deltas.append(detokenizer.finish())
    assert "".join(deltas) == detokenizer.output_text == "It is 4</ans"
    assert detokenizer.stop_string is None


def test_earliest_of_several_stop_strings_wins(smollm2_tokenizer):
    """Both 'story' and 'END' arrive in one add_tokens call: the earlier in the text wins, not the list order."""
    tok = smollm2_tokenizer
    detokenizer = IncrementalDetokenizer(tok, [], stop=["story", "END", "never"])
    detokenizer.add_tokens(tok.encode("The answer is 42. END of story."))
    assert detokenizer.stop_string == "END" and detokenizer.output_text == "The answer is 42. "


def test_a_multibyte_stop_string_split_over_byte_tokens(smollm2_tokenizer):
    """An emoji stop string, itself three byte tokens, is matched once the character is complete."""
    tok = smollm2_tokenizer
    detokenizer = IncrementalDetokenizer(tok, [], stop=["🎉"])
    deltas = stream(detokenizer, tok.encode("Party 🎉 time"))
    assert detokenizer.stop_string == "🎉"
    assert "".join(deltas) == detokenizer.output_text == "Party "


@pytest.mark.parametrize("skip,expected", [(True, "Hi. Bye"), (False, "Hi.<|im_end|> Bye")])
def test_skip_special_tokens(smollm2_tokenizer, skip, expected):
    """Special tokens are left out of the text when skip_special_tokens, and kept otherwise."""
    tok = smollm2_tokenizer
    ids = tok.encode("Hi.<|im_end|> Bye")
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids
    detokenizer = IncrementalDetokenizer(tok, tok.encode(PROMPT), skip_special_tokens=skip)
    assert "".join(stream(detokenizer, ids)) == detokenizer.output_text == expected


@pytest.mark.parametrize("include,expected", [(False, "Hi there"), (True, "Hi there<|im_end|>")])
def test_stop_terminated_leaves_out_the_stop_token_unless_asked(smollm2_tokenizer, include, expected):
    """With stop_terminated the last id (EOS, a stop_token_id) is text only if include_stop_str_in_output;
    held-back text is released at once."""
    tok = smollm2_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    detokenizer = IncrementalDetokenizer(tok, [], skip_special_tokens=False, stop=["there!"],
                                         include_stop_str_in_output=include)
    released = detokenizer.add_tokens(tok.encode("Hi there"))
    assert released == "Hi "  # 'there' may be the start of 'there!'
    released += detokenizer.add_tokens([eos], stop_terminated=True)
    assert released == detokenizer.output_text == expected
    assert detokenizer.finished and detokenizer.stop_string is None


class _WindowRecordingTokenizer:
    """Wraps a tokenizer and records how many ids each decode call got."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.window_lens = []

    def decode(self, token_ids, **kwargs):
        self.window_lens.append(len(token_ids))
        return self._tokenizer.decode(token_ids, **kwargs)


def test_cost_per_token_is_bounded_by_the_window_not_the_output(smollm2_tokenizer):
    """Over ~2,000 output tokens with stop strings set, no decode call sees more than a few ids."""
    tok = smollm2_tokenizer
    ids = tok.encode(" ".join(TEXTS) * 40)
    assert len(ids) > 2000
    recorder = _WindowRecordingTokenizer(tok)
    detokenizer = IncrementalDetokenizer(recorder, tok.encode(PROMPT) * 50, stop=["never appears", "ZZZ"])
    deltas = stream(detokenizer, ids)
    assert "".join(deltas) == tok.decode(ids)
    # Prompt context (5) + the longest run of byte tokens one character needs (4) + one token.
    assert max(recorder.window_lens) <= 10
    assert len(recorder.window_lens) <= 2 * len(ids) + 2


def test_rejects_an_empty_stop_string(smollm2_tokenizer):
    """An empty stop string would match at once: ValueError naming stop."""
    with pytest.raises(ValueError, match="^stop"):
        IncrementalDetokenizer(smollm2_tokenizer, [], stop=["ok", ""])


class PythonOnlyTokenizer:
    """The tokenizer without its Rust backend in reach: the detokenizer must fall back to transformers' decode."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_rust_backend_decodes_exactly_as_transformers(smollm2_tokenizer, skip_special_tokens):
    """Same deltas, token by token, through the backend and through transformers, special tokens and split
    characters included."""
    tok = smollm2_tokenizer
    ids = tok.encode("".join(TEXTS)) + tok.encode("<|im_end|>\n<|im_start|>x") + tok.encode("Party 🎉 time")
    fast = IncrementalDetokenizer(tok, tok.encode(PROMPT), skip_special_tokens=skip_special_tokens)
    slow = IncrementalDetokenizer(PythonOnlyTokenizer(tok), tok.encode(PROMPT),
                                  skip_special_tokens=skip_special_tokens)
    assert fast._backend_decode is not None and slow._backend_decode is None
    assert stream(fast, ids) == stream(slow, ids)
    assert fast.output_text == tok.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("text", TEXTS)
def test_appended_tokens_are_decoded_only_when_read_and_read_the_same(smollm2_tokenizer, text):
    """append_tokens() without stop strings only keeps the ids; output_text, read at any point, is what add_tokens
    token by token would have released by then, and the final text is the same."""
    tok = smollm2_tokenizer
    ids = tok.encode(text) + tok.encode(" more 🎉")
    recorder = _WindowRecordingTokenizer(tok)
    eager = IncrementalDetokenizer(tok, tok.encode(PROMPT))
    lazy = IncrementalDetokenizer(recorder, tok.encode(PROMPT))
    for position, token_id in enumerate(ids):
        eager.add_tokens([token_id])
        lazy.append_tokens([token_id])
        if position % 5 == 4:
            calls = len(recorder.window_lens)
            assert lazy.output_text == eager.output_text
            assert len(recorder.window_lens) <= calls + 5  # one catch-up, whatever was appended: 2 decodes + 3
    appended_only = len(recorder.window_lens)
    lazy.append_tokens([ids[0]])
    assert len(recorder.window_lens) == appended_only  # appending decodes nothing
    eager.add_tokens([ids[0]])
    eager.finish()
    lazy.finish()
    assert lazy.output_text == eager.output_text == tok.decode(ids + [ids[0]]).rstrip("\ufffd")


def test_appended_tokens_with_stop_strings_or_a_stop_token_are_decoded_at_once(smollm2_tokenizer):
    """Stop strings must be matched as text arrives, and a stop token ends the text: append_tokens decodes then."""
    tok = smollm2_tokenizer
    ids = tok.encode("The answer is 42. END of story.")
    with_stop = IncrementalDetokenizer(tok, [], stop=["END"])
    for token_id in ids:
        with_stop.append_tokens([token_id])
    assert with_stop.stop_string == "END" and with_stop.finished
    assert with_stop.output_text == "The answer is 42. "
    stop_token = IncrementalDetokenizer(tok, [])
    stop_token.append_tokens(ids[:3])
    stop_token.append_tokens([tok.eos_token_id], stop_terminated=True)
    assert stop_token.finished and stop_token.output_text == tok.decode(ids[:3])

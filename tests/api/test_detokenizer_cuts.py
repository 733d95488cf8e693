"""IncrementalDetokenizer when a completion ends in the middle of a multi-byte character (max_tokens, a stop
token, a stop string): the bytes of the incomplete last character are dropped, never shown as U+FFFD, and the
streamed deltas add up to the final text."""

import pytest

from jaxpaged.engine.detokenizer import IncrementalDetokenizer

# CJK, Hangul, emoji and accented Latin, each split into byte tokens by the embedded model's byte-level BPE.
MULTIBYTE_TEXTS = ["日本語のテキスト", "서울입니다", "👌🎉", "Ça coûte 5 €", "Tiếng Việt", "Łódź świętość"]


def stream(detokenizer: IncrementalDetokenizer, token_ids, chunk_size: int = 1) -> list[str]:
    """Feeds ids chunk by chunk, then finish(); returns every released delta."""
    deltas = [detokenizer.add_tokens(token_ids[i:i + chunk_size]) for i in range(0, len(token_ids), chunk_size)]
    return deltas + [detokenizer.finish()]


def cuts(tok, token_ids: list[int]) -> list[int]:
    """Every k such that token_ids[:k] ends in the middle of a character."""
    return [k for k in range(1, len(token_ids)) if tok.decode(token_ids[:k]).endswith("\ufffd")]


def whole_characters_of(tok, text: str, token_ids: list[int]) -> str:
    """The characters of text whose every byte is in token_ids, a prefix of text's tokens (an independent
    oracle: a byte-level BPE token string has one character per byte)."""
    num_bytes = sum(len(token) for token in tok.convert_ids_to_tokens(token_ids))
    return text.encode()[:num_bytes].decode("utf-8", errors="ignore")


@pytest.mark.parametrize("chunk_size", [1, 3])
@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_a_cut_mid_character_drops_only_that_characters_bytes(smollm2_tokenizer, text, chunk_size):
    """For every cut inside a character: the text is every whole character before it, in deltas and in the
    final text alike, and no U+FFFD is ever released."""
    tok = smollm2_tokenizer
    ids = tok.encode(text)
    assert cuts(tok, ids), "the text must really split a character over tokens"
    for cut in cuts(tok, ids):
        detokenizer = IncrementalDetokenizer(tok, tok.encode("Say it:"))
        deltas = stream(detokenizer, ids[:cut], chunk_size)
        expected = whole_characters_of(tok, text, ids[:cut])
        assert "".join(deltas) == detokenizer.output_text == expected, cut
        assert not any("\ufffd" in delta for delta in deltas)


def test_text_in_the_same_token_as_a_partial_character_is_kept(smollm2_tokenizer):
    """' ś' is one token holding a space and ś's first byte: cut there, the space stays, the byte goes."""
    tok = smollm2_tokenizer
    ids = tok.encode("Łódź świętość")
    assert tok.convert_ids_to_tokens(ids[6]) == "ĠÅ"  # the split this test needs: b" \xc5"
    detokenizer = IncrementalDetokenizer(tok, [])
    assert "".join(stream(detokenizer, ids[:7])) == detokenizer.output_text == "Łódź "


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_token_after_a_partial_character(smollm2_tokenizer, include):
    """EOS right after half an emoji: the half is dropped whether or not the stop token's text is asked for."""
    tok = smollm2_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("OK 👌🎉")
    cut = cuts(tok, ids)[-1]
    detokenizer = IncrementalDetokenizer(tok, [], include_stop_str_in_output=include)
    released = "".join(detokenizer.add_tokens([token_id]) for token_id in ids[:cut])
    released += detokenizer.add_tokens([eos], stop_terminated=True)
    assert released == detokenizer.output_text == "OK 👌"
    assert detokenizer.finished


@pytest.mark.parametrize("include,expected", [(False, "Łó"), (True, "Łódź ")])
def test_a_stop_string_held_behind_a_partial_character_still_stops_at_the_end(smollm2_tokenizer, include,
                                                                                expected):
    """'dź ' ends inside the token b' \\xc5', whose text waits for ś; cut there (max_tokens), finish() finds the
    stop string in what it releases: the text is cut at it and stop_string names it."""
    tok = smollm2_tokenizer
    ids = tok.encode("Łódź świętość")[:7]
    detokenizer = IncrementalDetokenizer(tok, [], stop=["dź "], include_stop_str_in_output=include)
    deltas = stream(detokenizer, ids)
    assert "".join(deltas) == detokenizer.output_text == expected
    assert detokenizer.stop_string == "dź "


@pytest.mark.parametrize("include,expected", [(False, "今日は"), (True, "今日は。")])
def test_a_stop_string_then_a_partial_character(smollm2_tokenizer, include, expected):
    """Stopped by '。' with bytes of the next character already sampled: nothing after the stop string shows."""
    tok = smollm2_tokenizer
    ids = tok.encode("今日は。晴れ")
    cut = cuts(tok, ids)[-1]
    detokenizer = IncrementalDetokenizer(tok, [], stop=["。"], include_stop_str_in_output=include)
    deltas = stream(detokenizer, ids[:cut])
    assert "".join(deltas) == detokenizer.output_text == expected
    assert detokenizer.stop_string == "。"


@pytest.mark.parametrize("stop", ["テキスト", "スト"])
def test_a_multibyte_stop_prefix_cut_mid_character(smollm2_tokenizer, stop):
    """A cut inside a character that would have continued a stop string: the whole characters are released,
    with no stop."""
    tok = smollm2_tokenizer
    text = "日本語のテキスト"
    ids = tok.encode(text)
    for cut in cuts(tok, ids):
        detokenizer = IncrementalDetokenizer(tok, [], stop=[stop])
        deltas = stream(detokenizer, ids[:cut])
        expected = whole_characters_of(tok, text, ids[:cut])
        assert stop not in expected
        assert "".join(deltas) == detokenizer.output_text == expected
        assert detokenizer.stop_string is None


class _WithoutRustBackend:
    """The tokenizer with only transformers' decode in reach: the detokenizer's window fallback runs."""

    def __init__(self, tokenizer):
        self.decode = tokenizer.decode


@pytest.mark.parametrize("stop", [(), ("ść",), ("dź ",)])
@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_the_decode_stream_releases_what_the_window_fallback_releases(smollm2_tokenizer, text, stop):
    """At every cut of every multi-byte text, fed one and three ids at a time, the DecodeStream path's deltas,
    final text and stop string are the window fallback's (an independent decode of the same ids)."""
    tok = smollm2_tokenizer
    ids = tok.encode(text) + tok.encode(" ok")
    for cut in range(1, len(ids) + 1):
        for chunk_size in (1, 3):
            fast = IncrementalDetokenizer(tok, tok.encode("Say it:"), stop=stop)
            slow = IncrementalDetokenizer(_WithoutRustBackend(tok), tok.encode("Say it:"), stop=stop)
            assert fast._stream is not None and slow._stream is None
            assert stream(fast, ids[:cut], chunk_size) == stream(slow, ids[:cut], chunk_size), (text, cut)
            assert (fast.output_text, fast.stop_string) == (slow.output_text, slow.stop_string)


def _byte_fallback_tokenizer():
    """A Llama-2-style tokenizer built here: unknown text falls back to <0xXX> byte tokens, decoded by ByteFallback
    (an invalid byte run becomes one U+FFFD per byte)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1} | {f"<0x{byte:02X}>": 2 + byte for byte in range(256)}
    vocab |= {piece: len(vocab) + i for i, piece in enumerate(["▁x", "▁", "x", "▁the"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>"), vocab


@pytest.mark.parametrize("chunk_size", [1, 2])
def test_a_stray_byte_after_released_text_falls_back_instead_of_raising(chunk_size):
    """'€' is released, then a byte that cannot continue it: a byte-fallback decode of the run is '���� x', which
    no longer starts with the released '€', and tokenizers' DecodeStream raises. The detokenizer goes on through the
    window path and releases what the window path alone releases."""
    tok, vocab = _byte_fallback_tokenizer()
    byte = lambda value: vocab[f"<0x{value:02X}>"]
    ids = [vocab["▁the"], byte(0xE2), byte(0x82), byte(0xAC), byte(0x80), vocab["▁x"], vocab["▁the"]]
    fast = IncrementalDetokenizer(tok, [vocab["▁x"]])
    slow = IncrementalDetokenizer(_WithoutRustBackend(tok), [vocab["▁x"]])
    assert fast._stream is not None
    assert stream(fast, ids, chunk_size) == stream(slow, ids, chunk_size)
    assert fast._stream is None  # it fell back
    assert fast.output_text == slow.output_text and fast.output_text.endswith(" x the")


def test_a_prompt_ending_inside_a_character_keeps_its_bytes_out_of_the_output(smollm2_tokenizer):
    """A token-id prompt whose last ids are the first bytes of a character: the output's first token completes it,
    but the character is the prompt's. Such a request stays on the window path: no prompt bytes leak."""
    tok = smollm2_tokenizer
    emoji = tok.encode("👌")
    assert len(emoji) > 1, "the emoji must span several byte tokens"
    prompt = tok.encode("It costs 5") + emoji[:-1]
    detokenizer = IncrementalDetokenizer(tok, prompt)
    assert detokenizer._stream is None
    deltas = stream(detokenizer, emoji[-1:] + tok.encode(" today"))
    assert "".join(deltas) == detokenizer.output_text == " today"

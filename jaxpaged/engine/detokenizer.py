"""Incremental detokenization: token ids in, the newly final text out, with stop strings matched on the fly.

With a fast tokenizer (always, in the engine) text comes from the tokenizers library's DecodeStream, primed with a
few prompt tokens (some tokenizers decide a token's leading space by what precedes it): it returns a token's text
once its character is complete, in Rust, a token at a time. A tokenizer without the Rust backend falls back to
decoding a short window of tokens twice, with and without the newest ones, and taking the difference; either way a
token costs O(1) in the output length. A caller that reads the text later (append_tokens) has tokens without stop
strings decoded only when it reads. Two kinds of text are held back rather than released:
  - a multi-byte UTF-8 character split across tokens, until its last byte arrives;
  - a tail of the text that is the beginning of a stop string: it may still become that stop string,
    and text after a stop string's start must never reach the user (unless include_stop_str_in_output).
When the completion ends, held-back stop-string prefixes are released, but the bytes of a character that never
completed are dropped (as vLLM's incremental detokenizer never releases them): the text never ends in half a
character, and the streamed deltas always add up to the final text. Bytes that never became a character followed
by more text come out as U+FFFD. The token ids still hold those bytes. Host-only; no jax.
"""

from collections.abc import Sequence
from typing import Optional

import tokenizers
from tokenizers.decoders import DecodeStream

_NUM_PROMPT_CONTEXT_TOKENS = 5
"""Prompt tokens decoded in front of the first output tokens, so the first delta gets its spacing right."""

_MAX_UNUSED_TOKENS = 64
"""Token ids before the window are dropped once this many pile up (amortizes the list shift)."""

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns one completion's token ids into text as they arrive, releasing only text that is final."""

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True,
                 stop: Sequence[str] = (), include_stop_str_in_output: bool = False) -> None:
        if isinstance(stop, str):
            stop = [stop]
        for stop_string in stop:
            if not isinstance(stop_string, str) or not stop_string:
                raise ValueError(f"stop: must hold only non-empty strings, got {stop_string!r}")
        self._tokenizer = tokenizer
        # A fast tokenizer's Rust backend decodes exactly what transformers' decode() returns without the space
        # clean-up (which is off here anyway), minus ~2.4 us of Python per call; two calls per token per request.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend: Optional[tokenizers.Tokenizer] = backend if isinstance(backend, tokenizers.Tokenizer) else None
        self._backend_decode = None if self._backend is None else self._backend.decode
        self._skip_special_tokens = skip_special_tokens
        self._stop = tuple(stop)
        self._include_stop_str_in_output = include_stop_str_in_output
        # Window bookkeeping (vLLM/TGI style): the text of _token_ids[_prefix_offset:_read_offset] was
        # already emitted; tokens from _read_offset on are not yet turned into text.
        self._token_ids = list(prompt_token_ids[-_NUM_PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._checked_end = self._read_offset
        """Every window ending at or before this many ids has been decoded once (a back-off skips those)."""
        self._pending_text = ""
        """Decoded text not yet released: it may be the beginning of a stop string."""
        self._released_chunks: list[str] = []
        self._stream: Optional[DecodeStream] = None
        """The fast path: ids from _read_offset on are fed to it one by one (the window below is then unused)."""
        self._context = list(self._token_ids)
        """Stream path: the last few ids whose text was released, to decode held tokens against at the end."""
        self._held: list[int] = []
        """Stream path: ids fed to the stream since its last text (their character is incomplete so far)."""
        # A prompt context ending inside a character would have the stream release that character's prompt bytes
        # with the first output token: such a request stays on the window path.
        if self._backend is not None and not self._decode(self._token_ids).endswith(_REPLACEMENT_CHAR):
            self._stream = self._primed_stream(skip_special_tokens)
        self._finished = False
        self.stop_string: Optional[str] = None
        """The stop string that ended the completion, or None."""

    def _primed_stream(self, skip_special_tokens: bool) -> Optional[DecodeStream]:
        """A DecodeStream that has seen the prompt context (its text is the prompt's, not released); None if the
        tokenizer refuses the context (see _stream_new_text)."""
        assert self._backend is not None
        stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        try:
            for token_id in self._token_ids:
                stream.step(self._backend, token_id)
        except Exception:  # noqa: BLE001 (tokenizers raises a bare Exception)
            return None
        return stream

    @property
    def output_text(self) -> str:
        """All text released so far (truncated at, or just after, a matched stop string), tokens appended with
        append_tokens() included."""
        if not self._finished and self._checked_end < len(self._token_ids):  # ids appended since the last decode
            self._take_text(self._decode_new_text(final=False), final=False)
        if len(self._released_chunks) > 1:
            # Joined only when read, so adding tokens never costs O(output length).
            self._released_chunks = ["".join(self._released_chunks)]
        return self._released_chunks[0] if self._released_chunks else ""

    @property
    def finished(self) -> bool:
        """True once a stop string matched or finish() was called; later tokens add no text."""
        return self._finished

    def add_tokens(self, new_token_ids: Sequence[int], *, stop_terminated: bool = False) -> str:
        """Takes newly sampled ids; returns the newly released text ("" while text is held back).

        stop_terminated: the last id ended the completion (EOS or a stop_token_id). Its text is left out
        unless include_stop_str_in_output, and all held-back text is released, as finish() does.
        """
        if self._finished:
            return ""
        new_token_ids = list(new_token_ids)
        if stop_terminated and not self._include_stop_str_in_output:
            new_token_ids = new_token_ids[:-1]
        self._token_ids.extend(new_token_ids)
        released = self._take_text(self._decode_new_text(final=False), final=False)
        if stop_terminated and not self._finished:
            released += self.finish()
        return released

    def append_tokens(self, new_token_ids: Sequence[int], *, stop_terminated: bool = False) -> None:
        """add_tokens() for a caller that reads the text later: without stop strings to match as text arrives,
        the ids are only kept, and decoded when output_text or finish() is next called. An offline completion is
        decoded once, not token by token (what a token costs is what bounds an engine step's host time)."""
        if self._stop or stop_terminated:
            self.add_tokens(new_token_ids, stop_terminated=stop_terminated)
        elif not self._finished:
            self._token_ids.extend(new_token_ids)

    def append_token(self, token_id: int) -> None:
        """append_tokens() of one id that does not end the completion (the per-step call of a running request)."""
        if self._stop:
            self.add_tokens((token_id,))
        elif not self._finished:
            self._token_ids.append(token_id)

    def finish(self) -> str:
        """The completion ended for another reason (length, abort, stop token): release held-back text,
        less the bytes of an incomplete last character. A stop string completed by that text still ends it."""
        if self._finished:
            return ""
        released = self._take_text(self._decode_new_text(final=True), final=True)
        self._finished = True
        return released

    def _decode(self, token_ids: Sequence[int]) -> str:
        # NOTE: clean_up_tokenization_spaces rewrites text by what follows it (" ." -> "."), which would
        # break the window difference below, so it is off.
        if self._backend_decode is not None:
            return self._backend_decode(token_ids, skip_special_tokens=self._skip_special_tokens)
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens,
                                      clean_up_tokenization_spaces=False)

    def _decode_new_text(self, *, final: bool) -> str:
        """Text of the tokens past _read_offset, or "" while it ends in an incomplete character; when final,
        that text without its incomplete last character."""
        if self._stream is not None:
            return self._stream_new_text(final=final)
        if self._read_offset == len(self._token_ids):
            return ""
        prefix_text = self._decode(self._token_ids[self._prefix_offset:self._read_offset])
        end = len(self._token_ids)
        window_text = self._decode(self._token_ids[self._prefix_offset:end])
        lowest_end = max(self._read_offset + 1, end - 3, self._checked_end + 1)
        self._checked_end = end
        if not final:
            # The last tokens end inside a character. Tokens appended unread (append_tokens) may have complete
            # text before them: release up to the last token that ends a character (a UTF-8 character spans at
            # most 4 byte tokens), as adding them one by one would have.
            while window_text.endswith(_REPLACEMENT_CHAR) and end > lowest_end:
                end -= 1
                window_text = self._decode(self._token_ids[self._prefix_offset:end])
            if window_text.endswith(_REPLACEMENT_CHAR):
                return ""
        else:
            # NOTE: a decode cannot tell an incomplete character from a literal trailing U+FFFD, so both are
            # dropped; one released mid-text (bytes that never became a character, then more text) is kept.
            window_text = window_text.rstrip(_REPLACEMENT_CHAR)
        self._prefix_offset = self._read_offset
        self._read_offset = end
        if self._prefix_offset >= _MAX_UNUSED_TOKENS:
            # No window reaches back past _prefix_offset again: drop those ids, so memory stays O(window).
            del self._token_ids[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._checked_end -= self._prefix_offset
            self._prefix_offset = 0
        return window_text[len(prefix_text):]

    def _stream_new_text(self, *, final: bool) -> str:
        """_decode_new_text through the DecodeStream, a token at a time (a list ending inside a character would hold
        back the whole list). The stream holds a token whose text ends in an incomplete character. When final, the
        window path decodes the held and unread tokens at once against the context before them: text in the same
        token as half a character is kept, and an offline completion read only at the end is decoded once."""
        stream, backend = self._stream, self._backend
        assert stream is not None and backend is not None
        unread = self._token_ids[self._read_offset:]
        self._token_ids.clear()  # the stream keeps the context it needs
        self._read_offset = self._prefix_offset = self._checked_end = 0
        held = self._held
        if final:
            return self._continue_on_window(held + unread, final=True)
        pieces = []
        for index, token_id in enumerate(unread):
            try:
                piece = stream.step(backend, token_id)
            except Exception:  # noqa: BLE001 (tokenizers raises a bare Exception)
                # A byte-fallback tokenizer can turn held bytes into U+FFFD that no longer extend the text the
                # stream released ("€" then a stray byte): it refuses; the window path takes over from here.
                return "".join(pieces) + self._continue_on_window(held + unread[index:], final=False)
            held.append(token_id)
            if piece is not None:
                pieces.append(piece)
                self._context = (self._context + held)[-_NUM_PROMPT_CONTEXT_TOKENS:]
                held.clear()
        return "".join(pieces)

    def _continue_on_window(self, pending: list[int], *, final: bool) -> str:
        """Leave the stream for the window path: the released context is the window's prefix, `pending` (ids the
        stream held or has not seen) its new tokens; their text so far (all of it, less an incomplete last
        character, when final)."""
        self._stream = None
        self._token_ids = self._context + pending
        self._prefix_offset = 0
        self._read_offset = self._checked_end = len(self._context)
        self._held = []
        return self._decode_new_text(final=final)

    def _take_text(self, new_text: str, *, final: bool) -> str:
        """Adds decoded text to the pending text, checks stop strings, and releases what is final."""
        text = self._pending_text + new_text
        match = self._first_stop_match(text)
        if match is not None:
            start, stop_string = match
            self.stop_string = stop_string
            self._finished = True
            self._pending_text = ""
            end = start + len(stop_string) if self._include_stop_str_in_output else start
            return self._release(text[:end])
        num_held = 0 if final else self._num_chars_that_may_start_a_stop(text)
        self._pending_text = text[len(text) - num_held:]
        return self._release(text[:len(text) - num_held])

    def _first_stop_match(self, text: str) -> Optional[tuple[int, str]]:
        """(start, stop string) of the earliest stop string in text; the longer one on a tie."""
        best = None
        for stop_string in self._stop:
            start = text.find(stop_string)
            if start != -1 and (best is None or (start, -len(stop_string)) < (best[0], -len(best[1]))):
                best = (start, stop_string)
        return best

    def _num_chars_that_may_start_a_stop(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of some stop string."""
        # NOTE: pending text never holds a whole stop string, so this is O(sum of stop lengths ** 2),
        # independent of the output length.
        longest = 0
        for stop_string in self._stop:
            for length in range(min(len(stop_string) - 1, len(text)), longest, -1):
                if text.endswith(stop_string[:length]):
                    longest = length
                    break
        return longest

    def _release(self, text: str) -> str:
        if text:
            self._released_chunks.append(text)
        return text

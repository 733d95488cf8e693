"""OpenAI response pieces built from engine outputs: usage, logprobs, and the per-choice deltas of a stream.

RequestOutput text, token ids and logprobs are cumulative; SampleProgress remembers what was already sent so
each streamed chunk carries only the difference.
"""

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from jaxpaged.outputs import CompletionOutput, Logprob, RequestOutput

# JSON has no -Infinity; a token the model rules out entirely still needs a number (OpenAI-style floor).
_MIN_LOGPROB = -9999.0


@dataclasses.dataclass
class SampleDelta:
    """What one sample gained since the previous chunk."""

    text: str
    """New text."""
    start_token: int
    """Index of the first new token."""
    end_token: int
    """One past the last new token."""
    finish_reason: Optional[str]
    """Set on the sample's last chunk."""


@dataclasses.dataclass
class SampleProgress:
    """How much of one sample a stream has sent."""

    num_chars: int = 0
    num_tokens: int = 0
    finished: bool = False

    def advance(self, sample: CompletionOutput, *, with_logprobs: bool) -> Optional[SampleDelta]:
        """The delta to send for this sample's latest state, or None when there is nothing new."""
        if self.finished:
            return None
        text = sample.text[self.num_chars:]  # released text only grows
        start, end = self.num_tokens, len(sample.token_ids)
        finish_reason = sample.finish_reason
        if not text and finish_reason is None and not (with_logprobs and end > start):
            return None  # tokens whose text is held back (a possible stop string, a partial character)
        self.num_chars += len(text)
        self.num_tokens = end
        self.finished = finish_reason is not None
        return SampleDelta(text, start, end, finish_reason)


def usage(finals: Sequence[RequestOutput], *, with_cached_tokens: bool = False) -> dict:
    """OpenAI usage over the engine requests of one HTTP request (each prompt counted once, every choice).

    `with_cached_tokens` (--enable-prompt-tokens-details) adds prompt_tokens_details.cached_tokens. Off by default,
    as in vLLM: prefix hits are token-granular and unsalted prefixes are shared between clients, so the count would
    let one client probe another's prompt a token at a time.
    """
    prompt_tokens = sum(len(output.prompt_token_ids) for output in finals)
    completion_tokens = sum(len(sample.token_ids) for output in finals for sample in output.outputs)
    counts: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}
    if with_cached_tokens:
        counts["prompt_tokens_details"] = {"cached_tokens": sum(output.num_cached_tokens for output in finals)}
    return counts


class TokenIdSpelling:
    """What the logprobs renderers take as their tokenizer under vLLM's return_tokens_as_token_ids: every token is
    spelled "token_id:<id>" (for clients that map ids themselves; a lone token of a multi-byte character has no
    valid text of its own)."""


TOKEN_IDS = TokenIdSpelling()


def token_text(tokenizer: Any, token_id: int, logprob: Optional[Logprob] = None) -> str:
    """A token's text, from the engine's decoded_token when it has one ("token_id:<id>" under TOKEN_IDS)."""
    if tokenizer is TOKEN_IDS:
        return f"token_id:{token_id}"
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id])


def _finite(value: float) -> float:
    return max(float(value), _MIN_LOGPROB) if value == value else _MIN_LOGPROB


def _top(entries: dict[int, Logprob], num_top: int) -> list[tuple[int, Logprob]]:
    return sorted(entries.items(), key=lambda item: item[1].rank)[:num_top]


def _completions_logprobs(tokenizer: Any, items: Iterable[tuple[int, Optional[dict[int, Logprob]]]], num_top: int,
                          text_offset: int) -> tuple[dict, int]:
    """The completions-API logprobs object of (token id, its logprob entries) pairs, and the text offset after
    them. Entries None (an echoed prompt's first token) give a null logprob and null alternatives."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    for token_id, entries in items:
        chosen = entries.get(token_id) if entries else None
        text = token_text(tokenizer, token_id, chosen)
        tokens.append(text)
        token_logprobs.append(_finite(chosen.logprob) if chosen is not None else None)
        top_logprobs.append(None if entries is None else {token_text(tokenizer, alt_id, alt): _finite(alt.logprob)
                                                          for alt_id, alt in _top(entries, num_top)})
        offsets.append(text_offset)
        text_offset += len(text)
    return ({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
             "text_offset": offsets}, text_offset)


def completion_logprobs(tokenizer: Any, sample: CompletionOutput, start: int, end: int, num_top: int,
                        text_offset: int) -> tuple[dict, int]:
    """The completions-API logprobs object of tokens [start, end), and the text offset after them."""
    logprobs = sample.logprobs or []
    items = ((sample.token_ids[p], logprobs[p] if p < len(logprobs) else {}) for p in range(start, end))
    return _completions_logprobs(tokenizer, items, num_top, text_offset)


def prompt_completion_logprobs(tokenizer: Any, output: RequestOutput, num_top: int) -> tuple[dict, int]:
    """The completions-API logprobs object of an echoed prompt (its first token has no logprob: null), and the
    text offset after it."""
    entries = output.prompt_logprobs or [None] * len(output.prompt_token_ids)
    return _completions_logprobs(tokenizer, zip(output.prompt_token_ids, entries), num_top, 0)


def vllm_prompt_logprobs(tokenizer: Any, output: RequestOutput, num_top: int) -> list[Optional[dict]]:
    """vLLM's prompt_logprobs: per prompt token (None for the first) {token id: {logprob, rank, decoded_token}}
    for the token itself and the num_top most likely ones."""
    entries = output.prompt_logprobs or [None] * len(output.prompt_token_ids)
    rendered: list[Optional[dict]] = []
    for token_id, position in zip(output.prompt_token_ids, entries):
        if position is None:
            rendered.append(None)
            continue
        kept = dict(_top(position, num_top))
        if token_id in position:
            kept[token_id] = position[token_id]
        rendered.append({alt_id: {"logprob": _finite(alt.logprob), "rank": alt.rank,
                                  "decoded_token": token_text(tokenizer, alt_id, alt)}
                         for alt_id, alt in kept.items()})
    return rendered


def join_logprobs(first: dict, second: dict) -> dict:
    """Two completions-API logprobs objects, one after the other (an echoed prompt, then the completion)."""
    return {key: first[key] + second[key] for key in first}


def _chat_token(tokenizer: Any, token_id: int, logprob: Optional[Logprob]) -> dict:
    text = token_text(tokenizer, token_id, logprob)
    return {"token": text, "logprob": _finite(logprob.logprob) if logprob is not None else _MIN_LOGPROB,
            "bytes": list(text.encode("utf-8", errors="replace"))}


def chat_logprobs(tokenizer: Any, sample: CompletionOutput, start: int, end: int, num_top: int) -> dict:
    """The chat-API logprobs object ({"content": [...]}) of tokens [start, end)."""
    content = []
    for position in range(start, end):
        token_id = sample.token_ids[position]
        entries = sample.logprobs[position] if sample.logprobs and position < len(sample.logprobs) else {}
        item = _chat_token(tokenizer, token_id, entries.get(token_id))
        item["top_logprobs"] = [_chat_token(tokenizer, alt_id, alt) for alt_id, alt in _top(entries, num_top)]
        content.append(item)
    return {"content": content}

"""vLLM's bad_words as token sequences: each word as it would be tokenized at the start of the text and after a
space, since a tokenizer spells " word" with other tokens than "word"."""

from collections.abc import Sequence

MAX_BAD_WORDS = 128
"""More bad words than this is a 400 (each one is checked on the host every step)."""


def bad_words_token_ids(tokenizer, words: Sequence[str]) -> list[list[int]]:
    """The token sequences the sampler bans: per word, its own tokens and, when they differ in their first token
    but not in their count, the tokens of " " + the word (a word-initial variant, not a split of the word)."""
    sequences = []
    for word in words:
        bare = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not bare:
            continue  # whitespace alone: nothing the output could spell
        sequences.append(bare)
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return sequences

"""The prefix-cache advisor on hand-built token ids whose chunk boundaries are known.

A token whose id is a multiple of 16 is an anchor: it starts a chunk if it sits >= MIN_CHUNK (8) tokens after the
previous chunk start. The helpers below build every non-anchor token as 16 * k + r with r in 1..15, and put anchors
exactly where a chunk should start, so each expected count can be worked out by hand.
"""

import itertools
import logging

import pytest

from jaxpaged.core.prefix_advisor import MAX_CHUNK, PrefixAdvisor, chunk_starts

_counter = itertools.count(1)


def plain(n: int) -> list[int]:
    """n fresh non-anchor token ids (never a multiple of 16, never repeated across calls)."""
    out = []
    while len(out) < n:
        value = next(_counter)
        if value % 16:
            out.append(1024 + value)
    return out


def anchor() -> int:
    """A fresh anchor token id (a multiple of 16)."""
    return 16 * (10_000 + next(_counter))


def body(num_chunks: int, chunk_len: int = 20) -> list[int]:
    """Shared content: num_chunks chunks of chunk_len tokens, each opened by an anchor."""
    return [t for _ in range(num_chunks) for t in [anchor()] + plain(chunk_len - 1)]


def timestamp_prompt(stamp_len: int, shared: list[int], question_len: int = 8) -> list[int]:
    """A varying head (no anchor), the shared body, then a varying question opened by an anchor."""
    return plain(stamp_len) + shared + [anchor()] + plain(question_len - 1)


def test_chunks_start_at_anchors_and_respect_min_and_max_length():
    tokens = plain(5) + [anchor()] + plain(3) + [anchor()] + plain(10) + [anchor()] + plain(MAX_CHUNK + 10)
    # Anchors at 5, 9 and 20; 9 is < 8 tokens after 5, so it is skipped; 20 + 64 = 84 is a forced cut.
    assert chunk_starts(tokens) == [0, 5, 20, 84]


def test_identical_prompt_misses_nothing():
    advisor = PrefixAdvisor()
    prompt = timestamp_prompt(5, body(10))
    advisor.admit(prompt, None, 0)
    again = advisor.admit(prompt, None, 208)  # whatever the cache had, the prompt never diverged
    assert again.divergence == len(prompt)
    assert again.missed_reusable_tokens == 0
    assert advisor.missed_reusable_tokens == 0


def test_timestamp_first_prompts_miss_the_whole_body():
    # First prompt: chunks [0,5) the stamp, then ten 20-token body chunks [5,205), then the question chunk (open).
    # Second prompt: a different 5-token stamp, so it diverges at token 0 and the cache has nothing; every body
    # chunk is closed by the next anchor (the last one by the question's anchor), so all 200 body tokens count.
    advisor = PrefixAdvisor()
    shared = body(10)
    first = advisor.admit(timestamp_prompt(5, shared), None, 0)
    assert first.missed_reusable_tokens == 0 and first.divergence == 0  # nothing seen yet
    second = advisor.admit(timestamp_prompt(5, shared), None, 0)
    assert second.divergence == 0
    assert second.missed_reusable_tokens == 200
    assert (second.shared_run_start, second.shared_run_len) == (5, 200)
    # A stamp of another length shifts the body by 2 tokens (not a multiple of any block): still found.
    shifted = advisor.admit(timestamp_prompt(7, shared), None, 0)
    assert shifted.missed_reusable_tokens == 200 and shifted.shared_run_start == 7
    assert advisor.missed_reusable_tokens == 400


def test_divergence_inside_a_chunk_and_the_cached_prefix():
    advisor = PrefixAdvisor()
    common = [anchor()] + plain(30)  # chunk 0 runs up to the first anchor after token 8: the whole 31 tokens
    shared = body(4)
    advisor.admit(common + plain(3) + shared + [anchor()] + plain(4), None, 0)
    other = common[:12] + plain(19) + plain(3) + shared + [anchor()] + plain(4)
    result = advisor.assess(other, None, 0)
    assert result.divergence == 12  # first differing token, found inside chunk 0
    assert result.missed_reusable_tokens == 80 and result.shared_run_start == 34
    # Tokens the prefix cache already served are not missed: here it (hypothetically) covered up to 48.
    assert advisor.assess(other, None, 48).missed_reusable_tokens == 80 - (48 - 34)


def test_a_longer_prompt_diverges_where_the_shorter_one_ended():
    advisor = PrefixAdvisor()
    prompt = timestamp_prompt(5, body(3))
    advisor.admit(prompt, None, 0)
    assert advisor.assess(prompt + plain(10), None, 0).divergence == len(prompt)


def test_other_cache_salt_sees_nothing():
    advisor = PrefixAdvisor()
    shared = body(10)
    advisor.admit(timestamp_prompt(5, shared), "tenant-a", 0)
    other = advisor.admit(timestamp_prompt(5, shared), "tenant-b", 0)
    assert other.missed_reusable_tokens == 0
    assert advisor.admit(timestamp_prompt(5, shared), None, 0).missed_reusable_tokens == 0
    assert advisor.admit(timestamp_prompt(5, shared), "tenant-a", 0).missed_reusable_tokens == 200


def test_memory_bound_holds_and_evicts_least_recent_first():
    advisor = PrefixAdvisor(max_entries=50)
    old = body(10)
    advisor.admit(timestamp_prompt(5, old), None, 0)
    for _ in range(20):
        advisor.admit(timestamp_prompt(5, body(10)), None, 0)
        assert len(advisor) <= 50
    assert advisor.assess(timestamp_prompt(5, old), None, 0).missed_reusable_tokens == 0  # evicted


def test_log_line_is_rate_limited_and_quotes_text_only_when_allowed(caplog):
    advisor = PrefixAdvisor(log_threshold=100, log_interval_s=3600)
    shared = body(10)
    caplog.set_level(logging.INFO, logger="jaxpaged.core.prefix_advisor")
    for _ in range(3):
        advisor.admit(timestamp_prompt(5, shared), None, 0, decode=lambda ids: "<snippet>")
    assert len(caplog.records) == 1  # the second and third misses fall within the interval
    message = caplog.records[0].getMessage()
    assert "diverged from earlier prompts at token 0" in message and "200 seen tokens" in message
    assert "<snippet>" in message
    quiet = PrefixAdvisor(log_threshold=100)
    caplog.clear()
    quiet.admit(timestamp_prompt(5, shared), None, 0)
    quiet.admit(timestamp_prompt(5, shared), None, 0)
    assert len(caplog.records) == 1 and "text there" not in caplog.records[0].getMessage()


def test_rejects_a_non_positive_bound():
    with pytest.raises(ValueError, match="max_entries"):
        PrefixAdvisor(max_entries=0)

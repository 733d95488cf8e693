"""Chain hashing of full blocks: sha256 over (parent hash, tokens, extra keys), salt in the first block only."""

import hashlib

import pytest

from jaxpaged.core import Request
from jaxpaged.core.hashing import ROOT_PARENT_HASH, hash_block_tokens, request_block_hash


def test_block_hash_is_sha256_of_parent_tokens_and_extra_keys():
    """An independent rebuild of the documented encoding: parent digest, int64 tokens, repr of the extra keys."""
    tokens = [1, 2, 3, 2**40]
    token_bytes = b"".join(token.to_bytes(8, "little", signed=True) for token in tokens)
    expected_first = hashlib.sha256(ROOT_PARENT_HASH + token_bytes + repr(("cache_salt", "s")).encode()).digest()
    first = hash_block_tokens(None, tokens, ("cache_salt", "s"))
    assert first == expected_first and len(first) == 32
    assert hash_block_tokens(first, tokens) == hashlib.sha256(first + token_bytes).digest()


def test_hash_depends_on_parent_tokens_and_extra_keys():
    base = hash_block_tokens(None, [1, 2, 3, 4])
    assert hash_block_tokens(None, [1, 2, 3, 4]) == base
    assert hash_block_tokens(None, [1, 2, 3, 5]) != base
    assert hash_block_tokens(base, [1, 2, 3, 4]) != base
    assert hash_block_tokens(None, [1, 2, 3, 4], ("cache_salt", "a")) != base


def test_request_hashes_chain_and_salt_only_the_first_block():
    tokens = list(range(12))
    plain = Request("plain", tokens)
    salted = Request("salted", tokens, cache_salt="tenant-a")
    expected = []
    parent = None
    for index in range(3):
        parent = hash_block_tokens(parent, tokens[4 * index:4 * index + 4],
                                   ("cache_salt", "tenant-a") if index == 0 else ())
        expected.append(parent)
    assert [request_block_hash(salted, index, 4) for index in range(3)] == expected
    assert salted.block_hashes == expected
    assert all(request_block_hash(plain, index, 4) != expected[index] for index in range(3))


def test_a_change_at_token_zero_changes_every_block_hash():
    first = Request("a", list(range(16)))
    second = Request("b", [99] + list(range(1, 16)))
    assert all(request_block_hash(first, index, 4) != request_block_hash(second, index, 4) for index in range(4))


def test_hashes_extend_to_blocks_filled_by_generated_tokens():
    request = Request("a", list(range(6)))
    with pytest.raises(ValueError, match="not full"):
        request_block_hash(request, 1, 4)
    request.append_output_token(6)
    request.append_output_token(7)
    assert request_block_hash(request, 1, 4) == hash_block_tokens(hash_block_tokens(None, [0, 1, 2, 3]), [4, 5, 6, 7])

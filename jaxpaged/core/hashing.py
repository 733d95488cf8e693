"""Chain hash of a full KV block: sha256 over (parent block's hash, the block's token ids, extra keys).

Two blocks with equal hashes hold the same K/V, because the hash covers every token before them (through
the parent) and everything else the K/V depends on (the extra keys).
"""

import array
import hashlib
from collections.abc import Sequence
from typing import Optional

from .request import Request

BlockHash = bytes
"""A 32-byte sha256 digest."""

ROOT_PARENT_HASH: BlockHash = bytes(32)
"""Stands in for the parent of a request's first block."""


def hash_block_tokens(parent_hash: Optional[BlockHash], token_ids: Sequence[int],
                      extra_keys: tuple = ()) -> BlockHash:
    """sha256 of one block given its parent's hash (None for the first block), tokens and extra keys."""
    digest = hashlib.sha256(ROOT_PARENT_HASH if parent_hash is None else parent_hash)
    # Every full block has the same token count, so the fixed-width encoding keeps the fields apart.
    digest.update(array.array("q", token_ids).tobytes())
    if extra_keys:
        digest.update(repr(extra_keys).encode())
    return digest.digest()


def block_extra_keys(request: Request, block_index: int) -> tuple:
    """What besides the tokens decides block `block_index`'s K/V: the cache salt, in the first block only, and the
    LoRA adapter (("lora", id, name, weights digest)), in every block as vLLM keys it (KV events report it per
    block; the digest keeps a persisted block from being hit by other weights under a reused id and name).

    Salting the first block is enough: every later hash chains through it. Multimodal input hashes (the blocks
    their placeholders cover) belong here later.
    """
    keys: tuple = ()
    if block_index == 0 and request.cache_salt is not None:
        keys = ("cache_salt", request.cache_salt)
    if request.lora_id:
        keys += ("lora", request.lora_id, request.lora_name, request.lora_fingerprint)
    return keys


def lora_of_extra_keys(extra_keys: Optional[tuple]) -> tuple[Optional[int], Optional[str]]:
    """(LoRA id, name) a block's extra keys name (block_extra_keys), or (None, None) for the base model."""
    if not extra_keys or "lora" not in extra_keys:
        return None, None
    index = extra_keys.index("lora")
    return extra_keys[index + 1], extra_keys[index + 2]


def request_block_hash(request: Request, block_index: int, block_size: int) -> BlockHash:
    """The chain hash of the request's block `block_index`, computing (and memoizing) any missing ones.

    The block must be full: its block_size tokens are all in request.all_token_ids.
    """
    hashes = request.block_hashes
    tokens = request.all_token_ids
    if (block_index + 1) * block_size > len(tokens):
        raise ValueError(f"block_index: block {block_index} of {request.request_id!r} is not full "
                         f"({len(tokens)} tokens, block_size {block_size})")
    # NOTE: tokens never change once known, so memoized hashes stay valid across preemptions.
    for index in range(len(hashes), block_index + 1):
        start = index * block_size
        parent = hashes[index - 1] if index else None
        hashes.append(hash_block_tokens(parent, tokens[start:start + block_size], block_extra_keys(request, index)))
    return hashes[block_index]


def request_parent_key(request: Request, block_index: int, block_size: int) -> BlockHash:
    """What precedes block `block_index` of the request, as a key: the previous block's chain hash, or for the
    first block a root key of the request's cache salt and LoRA adapter (so token-granular lookups never cross
    salts or adapters)."""
    if block_index > 0:
        return request_block_hash(request, block_index - 1, block_size)
    root = ROOT_PARENT_HASH
    if request.cache_salt is not None:
        root = hashlib.sha256(b"cache_salt\0" + request.cache_salt.encode()).digest()
    if request.lora_id:
        key = f"{request.lora_id}\0{request.lora_name}\0{request.lora_fingerprint}"
        root = hashlib.sha256(root + b"lora\0" + key.encode()).digest()
    return root

"""KV events with the prompt taken out ("redact": true in --kv-events-config): for a router that only needs which
blocks a replica holds, not what is in them.

A BlockStored event names its blocks by their chain hashes (already digests of the tokens), and also carries the
tokens themselves and, for a salted prompt's first block, the tenant's cache salt. Redacted, it carries no token ids
and, in place of each extra key's value (the salt), an HMAC-SHA256 of it under a key the subscribers never see: the
same salt gives the same digest (a router can still tell tenants' chains apart), and the digest does not give the
salt back. A key shared through redaction_key_file makes replicas agree on the digests; without one, each process
draws its own.
"""

import dataclasses
import hashlib
import hmac
import os
from pathlib import Path
from typing import Optional

from jaxpaged.core.kv_events import BlockStored, KVCacheEvent

DIGEST_PREFIX = "hmac-sha256:"
_MIN_KEY_BYTES = 16


def load_redaction_key(path: Optional[str]) -> bytes:
    """The bytes of the key file, or a fresh random key for this process; ValueError naming the field if short."""
    if path is None:
        return os.urandom(32)
    try:
        key = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"kv_events_config: redaction_key_file {path!r} cannot be read ({error})") from None
    if len(key) < _MIN_KEY_BYTES:
        raise ValueError(f"kv_events_config: redaction_key_file {path!r} holds {len(key)} bytes; a key needs "
                         f"at least {_MIN_KEY_BYTES}")
    return key


class EventRedactor:
    """Rewrites BlockStored events without token ids and with keyed digests of their extra keys' values."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def digest(self, value: str) -> str:
        """The keyed digest published in place of `value`."""
        return DIGEST_PREFIX + hmac.new(self._key, value.encode(), hashlib.sha256).hexdigest()

    def _redact_keys(self, keys: Optional[tuple]) -> Optional[tuple]:
        if keys is None:
            return None
        # ("cache_salt", salt): the name is kept (a router scopes chains by it), the value replaced by its digest.
        return tuple(self.digest(str(item)) if index % 2 == 1 else item for index, item in enumerate(keys))

    def redact(self, event: KVCacheEvent) -> KVCacheEvent:
        """The event as a redacting publisher sends it (only BlockStored carries anything to take out)."""
        if not isinstance(event, BlockStored):
            return event
        return dataclasses.replace(event, token_ids=(),
                                   extra_keys=tuple(self._redact_keys(keys) for keys in event.extra_keys))

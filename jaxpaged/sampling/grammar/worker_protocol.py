"""The pipe protocol between the engine and a grammar worker (compile_worker.py): length-prefixed pickles.

A frame is an 8-byte big-endian length, then a pickle. Both ends are this package's own code (the worker is a child
of the engine), so the pickles are trusted.
"""

import pickle
import struct
from typing import IO, Any, Optional

_HEADER = struct.Struct(">Q")
WORKER_NICENESS = 10
"""How much lower than the engine the grammar work runs (os.nice): on a busy host the streams come first."""
CRASH_ON_ENV = "JAXPAGED_GRAMMAR_WORKER_TEST_CRASH_ON"
"""Test-only: a worker started with this variable set calls os.abort() on a regex equal to its value (the stand-in
for a grammar that crashes llguidance, in tests of the crash path)."""


def write_frame(stream: IO[bytes], message: Any) -> None:
    """Writes one length-prefixed pickle and flushes it."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def read_frame(stream: IO[bytes]) -> Optional[Any]:
    """The next message, or None at the end of the stream (the other side closed or died)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    payload = stream.read(_HEADER.unpack(header)[0])
    return pickle.loads(payload)

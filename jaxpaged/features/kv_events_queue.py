"""The KV events publisher's own queue: messages the socket has not taken yet, bounded in bytes, not in count.

A count of messages bounds nothing when one message can be large (issue 56: a message high-water mark let a
stalled subscriber pin 763 MiB). This queue holds at most max_bytes of payload; a message that does not fit pushes
out the oldest ones, which are counted as dropped (a subscriber sees the gap in the sequence numbers).
"""

import collections


class ByteBoundedQueue:
    """A FIFO of byte strings whose total size stays at or under max_bytes, dropping the oldest to make room."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._messages: collections.deque[tuple[bytes, ...]] = collections.deque()
        self.queued_bytes = 0
        """The payload bytes held now."""
        self.peak_bytes = 0
        """The most payload bytes ever held at once."""
        self.num_dropped = 0
        """Messages dropped to stay under max_bytes."""

    @staticmethod
    def size_of(message: tuple[bytes, ...]) -> int:
        """A multipart message's bytes (its frames together)."""
        return sum(len(frame) for frame in message)

    def push(self, message: tuple[bytes, ...]) -> None:
        """Appends a message, dropping the oldest (or this one, if it alone is over the bound) to stay bounded."""
        size = self.size_of(message)
        if size > self.max_bytes:
            self.num_dropped += 1
            return
        while self.queued_bytes + size > self.max_bytes:
            self.queued_bytes -= self.size_of(self._messages.popleft())
            self.num_dropped += 1
        self._messages.append(message)
        self.queued_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)

    def peek(self) -> tuple[bytes, ...]:
        """The oldest message, left in place (IndexError when empty)."""
        return self._messages[0]

    def pop(self) -> tuple[bytes, ...]:
        """Removes and returns the oldest message."""
        message = self._messages.popleft()
        self.queued_bytes -= self.size_of(message)
        return message

    def __len__(self) -> int:
        return len(self._messages)

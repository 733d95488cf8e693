"""The waiting queue, ordered by the scheduling policy: arrival order ("fcfs") or (priority, arrival) ("priority")."""

import collections
import heapq
import itertools
from collections.abc import Iterator

from .request import Request


class FcfsRequestQueue:
    """First come, first served; a preempted request goes back to the front."""

    def __init__(self) -> None:
        self._requests: collections.deque[Request] = collections.deque()

    def add(self, request: Request) -> None:
        """Queue a new request at the back."""
        self._requests.append(request)

    def prepend(self, request: Request) -> None:
        """Queue a preempted request at the front: it was admitted before everything still waiting."""
        self._requests.appendleft(request)

    def peek(self) -> Request:
        """The request to admit next."""
        return self._requests[0]

    def pop(self) -> Request:
        """Remove and return the request to admit next."""
        return self._requests.popleft()

    def remove(self, request: Request) -> None:
        """Take out a request wherever it is (abort); O(n)."""
        self._requests.remove(request)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)


class PriorityRequestQueue:
    """Lowest priority value first, then earliest arrival, then insertion order."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._insertion_counter = itertools.count()

    def add(self, request: Request) -> None:
        """Queue a request by its (priority, arrival_time)."""
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._insertion_counter), request))

    def prepend(self, request: Request) -> None:
        """A preempted request keeps its place by priority: a more urgent waiting request still goes first."""
        self.add(request)

    def peek(self) -> Request:
        """The request to admit next."""
        return self._heap[0][3]

    def pop(self) -> Request:
        """Remove and return the request to admit next."""
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        """Take out a request wherever it is (abort); O(n)."""
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3]))


RequestQueue = FcfsRequestQueue | PriorityRequestQueue


def make_request_queue(scheduling_policy: str) -> RequestQueue:
    """The waiting queue for "fcfs" or "priority"."""
    if scheduling_policy == "fcfs":
        return FcfsRequestQueue()
    if scheduling_policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"scheduling_policy: must be 'fcfs' or 'priority', got {scheduling_policy!r}")

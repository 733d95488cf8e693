"""Preemption by recompute: when a running request's next tokens find no free blocks, another running request gives
all of its blocks back and waits again at the head of the queue, to compute its tokens anew once admitted."""

from .kv_cache_manager import KVCacheManager
from .request import Request, RequestStatus
from .request_queue import RequestQueue
from .scheduler_output import ScheduledRequest


class Preemption:
    """Chooses the request to preempt and preempts it."""

    def __init__(self, kv_cache_manager: KVCacheManager, waiting: RequestQueue, scheduling_policy: str) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.waiting = waiting
        """The queue a preempted request goes back to, first."""
        self.scheduling_policy = scheduling_policy
        self.num_preemptions = 0
        """Preemptions since start."""

    def select_victim_index(self, running: list[Request]) -> int:
        """The running request to preempt: the latest admitted ("fcfs"), or the lowest priority, then latest
        arrival ("priority"; ties go to the latest admitted)."""
        victim_index = len(running) - 1
        if self.scheduling_policy == "priority":
            victim = running[victim_index]
            for index in range(len(running) - 2, -1, -1):
                candidate = running[index]
                if (candidate.priority, candidate.arrival_time) > (victim.priority, victim.arrival_time):
                    victim_index, victim = index, candidate
        return victim_index

    def preempt(self, running: list[Request], victim_index: int, current_index: int,
                scheduled: list[ScheduledRequest], preempted_request_ids: set[str]) -> int:
        """Free all of running[victim_index]'s blocks, restart it at 0 and queue it first (`current_index`: the
        request being scheduled; one before it may already hold a row of this step). Returns the budget the victim
        gives back if it was already scheduled in this step."""
        victim = running.pop(victim_index)
        num_returned_tokens = 0
        if victim_index < current_index:
            for position, scheduled_request in enumerate(scheduled):
                if scheduled_request.request is victim:
                    num_returned_tokens = len(scheduled.pop(position).token_ids)
                    break
        # Tokens scheduled in this very step were counted as computed but never ran.
        self.kv_cache_manager.free(victim, tail_is_computed=num_returned_tokens == 0)
        victim.status = RequestStatus.PREEMPTED
        victim.num_computed_tokens = 0
        victim.num_pending_tokens = 0  # a token still in flight is dropped: the recompute samples it again
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(victim)
        preempted_request_ids.add(victim.request_id)
        return num_returned_tokens

"""Admission: waiting requests join the running ones in policy order, each starting at its prefix-cache hit, while the
step has budget, sampling rows and free blocks for them. The head of the queue that does not fit waits; nobody
overtakes it.

A model with several KV layer groups (runner/kv_spec.py: sliding-window layers beside full-attention ones) counts an
admission's blocks per group in its KV cache manager (kv_cache_groups.py allocate_hit).
"""

from .kv_cache_manager import KVCacheManager, PrefixHit
from .request import Request, RequestStatus
from .request_queue import RequestQueue
from .scheduler_output import ScheduledRequest


class Admission:
    """Admits waiting requests into a step."""

    def __init__(self, kv_cache_manager: KVCacheManager, waiting: RequestQueue, max_num_seqs: int,
                 long_prefill_token_threshold: int, max_loras: int = 0) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.waiting = waiting
        """New and preempted requests, in admission order of the policy."""
        self.max_num_seqs = max_num_seqs
        self.long_prefill_token_threshold = long_prefill_token_threshold
        """Most prompt tokens one admission computes per step (0: no cap beyond the budget)."""
        self.max_loras = max_loras
        """Most LoRA adapters the running requests may use at once (the device slots; 0: LoRA off)."""

    def admit(self, running: list[Request], scheduled: list[ScheduledRequest], budget: int,
              num_spec_rows: int) -> int:
        """Admit waiting requests into `running` and their rows into `scheduled`; the budget left."""
        kv = self.kv_cache_manager
        waiting = self.waiting
        max_running = self.max_num_seqs - num_spec_rows  # the step's proposals hold sampling rows too
        adapters = {request.lora_id for request in running if request.lora_id} if self.max_loras else set()
        while len(waiting) > 0 and budget > 0 and len(running) < max_running:
            request = waiting.peek()
            if self.max_loras and request.lora_id and request.lora_id not in adapters:
                if len(adapters) >= self.max_loras:
                    break  # every adapter slot is some running request's: the head waits for one to free
                adapters.add(request.lora_id)
            hit = kv.find_prefix_hit(request)
            if not self._allocate(request, hit, budget):
                if hit.copy_source is None:
                    break  # the head of the queue waits for blocks; nobody overtakes it
                # The copy holds its source beside the block it fills: one block more than computing those
                # tokens. In a pool that small the head of the queue would wait for blocks nobody will free.
                hit = hit.without_copy()
                if not self._allocate(request, hit, budget):
                    break
            num_hit_tokens = hit.num_tokens
            if hit.lower_tier_hashes:
                # Reads (and checks) the blocks now; a damaged one shortens the hit, which only shrinks the step.
                num_hit_tokens = kv.load_lower_tier_blocks(request, hit)
            tokens = request.all_token_ids
            num_new_tokens = self._num_admitted_tokens(request, num_hit_tokens, budget)
            waiting.pop()
            kv.record_prefix_lookup(len(tokens), num_hit_tokens)
            if request.status is RequestStatus.WAITING:
                request.num_cached_tokens = num_hit_tokens
            request.status = RequestStatus.RUNNING
            running.append(request)
            end = num_hit_tokens + num_new_tokens
            scheduled.append(ScheduledRequest(request, tokens[num_hit_tokens:end], num_hit_tokens,
                                              kv.get_block_ids(request.request_id), end == len(tokens)))
            if end == len(tokens):
                request.num_pending_tokens = 1
            request.num_computed_tokens = end
            budget -= num_new_tokens
        return budget

    def _num_admitted_tokens(self, request: Request, num_hit_tokens: int, budget: int) -> int:
        """Prompt tokens an admission computes in this step after its num_hit_tokens from the cache."""
        return min(request.num_tokens - num_hit_tokens, self.long_prefill_token_threshold or budget, budget)

    def _allocate(self, request: Request, hit: PrefixHit, budget: int) -> bool:
        """Give a waiting request its hit blocks and the blocks of this step's tokens; False (nothing changed)
        when the free blocks do not suffice."""
        num_new_tokens = self._num_admitted_tokens(request, hit.num_tokens, budget)
        return self.kv_cache_manager.allocate_hit(request, num_new_tokens, hit) is not None

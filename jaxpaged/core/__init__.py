"""Host-side engine core: requests, the paged KV block pool, the prefix cache and the scheduler.

Plain Python only (never jax, nor numpy), so it is cheap per step and testable without a device.
"""

from .block_pool import NULL_BLOCK_ID, BlockPool
from .kv_cache_manager import KVCacheManager
from .request import Request, RequestStatus
from .scheduler import Scheduler
from .scheduler_output import ScheduledRequest, SchedulerOutput
from .scheduler_stats import SchedulerStats

__all__ = ["NULL_BLOCK_ID", "BlockPool", "KVCacheManager", "Request", "RequestStatus", "Scheduler",
           "ScheduledRequest", "SchedulerOutput", "SchedulerStats"]

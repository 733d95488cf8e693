"""Host-side engine core: requests, the paged KV block pool, the prefix cache and the scheduler.

Plain Python only (never jax, nor numpy), so it is cheap per step and testable without a device.
"""

from jaxpaged.core.block_pool import NULL_BLOCK_ID, BlockPool
from jaxpaged.core.kv_cache_manager import KVCacheManager
from jaxpaged.core.request import Request, RequestStatus
from jaxpaged.core.scheduler import Scheduler
from jaxpaged.core.scheduler_output import ScheduledRequest, SchedulerOutput
from jaxpaged.core.scheduler_stats import SchedulerStats

__all__ = ["NULL_BLOCK_ID", "BlockPool", "KVCacheManager", "Request", "RequestStatus", "Scheduler",
           "ScheduledRequest", "SchedulerOutput", "SchedulerStats"]

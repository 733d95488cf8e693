"""The step plan process 0 broadcasts before every step, over JAX's collectives (no transport of our own).

A plan is two broadcasts: a fixed 3-int header (what to do, which data-parallel rank, which bucket), then, for
a step, that bucket's StepInputs (for a block copy, its fixed batch of pairs). Both have shapes fixed by the
bucket ladder, so each broadcast is one of a few compiled programs; warm_up() compiles them all on every
process, in the same order, before serving.

With KV cache groups (runner/kv_spec.py) a step's StepInputs carry every group's block tables and slots
(StepInputs.group_tables): a sliding group's freed blocks are already the null block there, so a follower needs
nothing of the scheduler's state. Every process has built runners of the same shapes (runner/process_agreement.py
checked it before warm-up), so the leader's and the followers' batches of a bucket are alike.
"""

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
from jax.experimental import multihost_utils

from jaxpaged.runner.batch import StepInputs
from jaxpaged.runner.block_copy import empty_copy_batch
from jaxpaged.runner.buckets import Bucket


class PlanKind(enum.IntEnum):
    STEP = 1
    """Run rank `rank`'s compiled step of bucket `bucket_index` on the StepInputs that follow."""
    HEARTBEAT = 2
    """Nothing to run: process 0 is idle and shows it is alive (and checks that the followers are)."""
    SHUTDOWN = 3
    """Process 0 is exiting: followers exit 0."""
    COPY_BLOCKS = 4
    """Apply rank `rank`'s batch of KV block copies (runner/block_copy.py) that follows; a step follows later."""
    BATCH_DONE = 5
    """Process 0's LLM.generate call returned: the followers' same call returns too (multihost/batch.py)."""


@dataclasses.dataclass(frozen=True)
class StepPlan:
    kind: PlanKind
    rank: int = 0
    bucket: Optional[Bucket] = None
    inputs: Optional[StepInputs] = None
    copies: Optional[np.ndarray] = None


class StepPlanChannel:
    """Process 0 publishes plans; every other process receives them, in the same order."""

    def __init__(self, buckets: Sequence[Bucket], empty_inputs: Callable[[Bucket], StepInputs]) -> None:
        """`empty_inputs`: a padding batch of a bucket, shaped as the runner builds its steps (its block tables per
        KV cache group: StepInputBuilder.empty), which a follower receives the plan's StepInputs into."""
        self.buckets = list(buckets)
        self._bucket_index = {bucket: index for index, bucket in enumerate(self.buckets)}
        self._empty = empty_inputs

    def publish(self, plan: StepPlan) -> None:
        """Process 0: broadcast one plan (returns once every process has it)."""
        bucket_index = -1 if plan.bucket is None else self._bucket_index[plan.bucket]
        multihost_utils.broadcast_one_to_all(np.array([plan.kind, plan.rank, bucket_index], np.int32))
        if plan.kind == PlanKind.STEP:
            multihost_utils.broadcast_one_to_all(plan.inputs)
        elif plan.kind == PlanKind.COPY_BLOCKS:
            multihost_utils.broadcast_one_to_all(plan.copies)

    def receive(self) -> StepPlan:
        """A follower: wait for the next plan."""
        kind, rank, bucket_index = (int(v) for v in multihost_utils.broadcast_one_to_all(np.zeros(3, np.int32)))
        if kind == PlanKind.COPY_BLOCKS:
            return StepPlan(PlanKind.COPY_BLOCKS, rank, copies=multihost_utils.broadcast_one_to_all(empty_copy_batch()))
        if kind != PlanKind.STEP:
            return StepPlan(PlanKind(kind))
        bucket = self.buckets[bucket_index]
        inputs = multihost_utils.broadcast_one_to_all(self._empty(bucket))
        return StepPlan(PlanKind.STEP, rank, bucket, inputs)

    def warm_up(self) -> None:
        """Every process: compile the header broadcast and each bucket's input broadcast (same calls everywhere)."""
        multihost_utils.broadcast_one_to_all(np.zeros(3, np.int32))
        multihost_utils.broadcast_one_to_all(empty_copy_batch())
        for bucket in self.buckets:
            multihost_utils.broadcast_one_to_all(self._empty(bucket))

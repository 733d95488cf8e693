"""Joining a multi-process JAX job: the flags (JAX's names), jax.distributed.initialize, and exit codes."""

import argparse
import dataclasses
import logging
from typing import Optional

import jax

from jaxpaged.checks import is_int, is_number

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
"""Default bound on any wait for another process (a step, a heartbeat, the next plan)."""

EXIT_FOLLOWER_LOST = 3
"""Process 0's exit code when a follower died or stopped answering."""
EXIT_LEADER_LOST = 4
"""A follower's exit code when process 0 died or stopped sending plans."""


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """How this process joins a multi-process job; all None (and auto_detect False) is a single process."""

    coordinator_address: Optional[str] = None
    """HOST:PORT of process 0's coordination service (jax.distributed's name)."""
    num_processes: Optional[int] = None
    """Processes in the job: one per host."""
    process_id: Optional[int] = None
    """This process's index; 0 leads (schedules and serves HTTP)."""
    auto_detect: bool = False
    """Call jax.distributed.initialize() with no arguments (a TPU pod slice or a known cluster fills them in)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Longest wait for another process before this one gives up on the job and exits non-zero."""

    def __post_init__(self) -> None:
        given = [self.coordinator_address, self.num_processes, self.process_id]
        if any(value is not None for value in given) and any(value is None for value in given):
            raise ValueError("coordinator_address: --coordinator-address, --num-processes and --process-id go "
                             f"together (got {self.coordinator_address!r}, {self.num_processes!r}, "
                             f"{self.process_id!r}); or use --distributed alone to auto-detect them")
        if self.num_processes is not None and (not is_int(self.num_processes) or self.num_processes < 1):
            raise ValueError(f"num_processes: must be a positive int, got {self.num_processes!r}")
        if self.process_id is not None and self.num_processes is not None and (
                not is_int(self.process_id) or not 0 <= self.process_id < self.num_processes):
            raise ValueError(f"process_id: must be in [0, num_processes={self.num_processes}), "
                             f"got {self.process_id!r}")
        if not is_number(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"distributed_timeout: must be a positive number of seconds, got {self.timeout_s!r}")

    @property
    def enabled(self) -> bool:
        return self.auto_detect or self.coordinator_address is not None


def add_distributed_arguments(parser: argparse.ArgumentParser) -> None:
    """The multi-host flags of `jaxpaged serve`."""
    group = parser.add_argument_group("multi-host (one process per host; process 0 serves HTTP)")
    group.add_argument("--coordinator-address", default=None, help="HOST:PORT of process 0 (jax.distributed)")
    group.add_argument("--num-processes", type=int, default=None, help="processes in the job, one per host")
    group.add_argument("--process-id", type=int, default=None, help="this process's index (0 leads)")
    group.add_argument("--distributed", action="store_true",
                       help="join with jax.distributed.initialize() auto-detection (TPU pod slices)")
    group.add_argument("--distributed-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       help=f"seconds to wait for another process before giving up (default {DEFAULT_TIMEOUT_S:g})")


def options_from_args(args: argparse.Namespace) -> DistributedOptions:
    return DistributedOptions(args.coordinator_address, args.num_processes, args.process_id,
                              auto_detect=args.distributed, timeout_s=args.distributed_timeout)


def initialize(options: DistributedOptions) -> None:
    """Joins the job before anything else touches JAX (the device list becomes every host's devices)."""
    # CPU hosts talk through gloo (TCP); TPU and GPU use their own interconnects and ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Our own bound (timeout_s) fires first; the coordination service's heartbeat timeout is the backstop
    # that ends a process whose Python is stuck for good.
    backstop = int(4 * options.timeout_s) + 10
    if options.auto_detect and options.coordinator_address is None:
        jax.distributed.initialize(heartbeat_timeout_seconds=backstop)
    else:
        jax.distributed.initialize(options.coordinator_address, options.num_processes, options.process_id,
                                   heartbeat_timeout_seconds=backstop)
    logger.info("joined the job as process %d of %d; %d devices in all, %d here", jax.process_index(),
                jax.process_count(), jax.device_count(), jax.local_device_count())


def is_multi_process() -> bool:
    return jax.process_count() > 1


def is_leader() -> bool:
    """Process 0 (also the only process of a single-process run) schedules and serves."""
    return jax.process_index() == 0

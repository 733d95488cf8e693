"""Joining a multi-process JAX job (jax.distributed.initialize, from EngineConfig's multihost group), and exit codes.

The flags (--coordinator-address, --num-processes, --process-id, --distributed, --distributed-timeout) are the
engine options of config.MultiHostConfig, so `serve`, `generate` and LLM(...) all take them.
"""

import logging

import jax

from jaxpaged.config import MultiHostConfig

logger = logging.getLogger(__name__)

EXIT_FOLLOWER_LOST = 3
"""Process 0's exit code when a follower died or stopped answering."""
EXIT_LEADER_LOST = 4
"""A follower's exit code when process 0 died or stopped sending plans."""


def join_job(options: MultiHostConfig) -> None:
    """Joins the job when `options` asks to and this process has not joined one yet; must run before anything
    else uses JAX (the device list becomes every host's devices)."""
    if not options.joins_job or jax.distributed.is_initialized():
        return
    # CPU hosts talk through gloo (TCP); TPU and GPU use their own interconnects and ignore this setting.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Our own bound (distributed_timeout) fires first; the coordination service's heartbeat timeout is the
    # backstop that ends a process whose Python is stuck for good.
    backstop = int(4 * options.distributed_timeout) + 10
    if options.coordinator_address is None:
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

"""The batch API (LLM, jaxpaged.generate, `jaxpaged generate`) on a multi-host job, run as one SPMD script.

Every process runs the same script: it builds LLM(...) with the same options and calls generate with the same
inputs. Process 0 joins the job, loads its shards and schedules, as the server does (features/multihost.py
broadcasts each step's plan); every other process builds a FollowerBatches instead, which runs process 0's plans
and nothing else. Each process 0 generate call ends with a BATCH_DONE plan, so a follower's matching call returns
(an empty list: only process 0 has the outputs) however process 0's call ended, and closing (LLM.close, `with`,
or the interpreter's exit through atexit) ends with SHUTDOWN, after which every process can exit 0.

While a follower waits for process 0's next call (or its close), process 0 may be doing any work of its own, so
that wait has no deadline; a dead process 0 still ends it (the collective fails), and within a call each plan
must arrive within 2 * distributed_timeout (multihost/follower.py).
"""

import logging
from typing import Any, Optional

from jaxpaged.config import EngineConfig, kernel_options_from_environment
from jaxpaged.multihost.follower import Follower, leader_lost
from jaxpaged.multihost.runtime import join_job
from jaxpaged.multihost.step_plan import PlanKind
from jaxpaged.weights.loader import load_model
from jaxpaged.weights.tokenizer_source import load_tokenizer

logger = logging.getLogger(__name__)


def join_job_of(engine_options: dict[str, Any]) -> EngineConfig:
    """The config of LLM's flat engine options, after joining the multi-host job they name (if any)."""
    config = EngineConfig.from_options(**{**kernel_options_from_environment(engine_options), **engine_options})
    join_job(config.multihost)
    return config


class FollowerBatches:
    """LLM(...) on a follower process: the same shards and compiled steps as process 0, run on its plans, one
    generate call at a time; the tokenizer too, so a script's get_tokenizer() and chat() work on every process."""

    def __init__(self, model: Optional[str], revision: Optional[str], config: EngineConfig) -> None:
        from jaxpaged.engine import enable_persistent_compilation_cache

        if config.compilation_cache_dir != "":
            enable_persistent_compilation_cache(config.compilation_cache_dir)
        loaded = load_model(model, revision=revision, quantization=config.quantization)
        self.tokenizer = load_tokenizer(loaded.tokenizer_dir, config.tokenizer)
        self._follower = Follower(loaded, config)
        self._closed = False

    def follow_batch(self) -> None:
        """Runs process 0's plans until its matching generate call returns (or it closes the job)."""
        if not self._closed and self._run_until({PlanKind.BATCH_DONE, PlanKind.SHUTDOWN}) == PlanKind.SHUTDOWN:
            self._closed = True

    def close(self) -> None:
        """Runs process 0's plans until it closes; later calls do nothing."""
        if not self._closed:
            self._closed = True
            self._run_until({PlanKind.SHUTDOWN})
            logger.info("process 0 closed the job after %d steps", self._follower.num_steps)

    def _run_until(self, stops: set[PlanKind]) -> PlanKind:
        try:
            return self._follower.run_until(stops, first_wait_s=None)
        except Exception:  # a collective failed: process 0 (or another follower) is gone
            logger.exception("lost the job after %d steps", self._follower.num_steps)
            leader_lost("a failed collective")
            raise  # not reached: leader_lost exits

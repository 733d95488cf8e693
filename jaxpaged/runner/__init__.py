"""The runner: the device side of an engine step. Its public face is ModelRunner (one per data-parallel rank,
built by build_rank_runners), the ForwardedStep its forward() hands to its sample(), LockStepRanks (the ranks that
step as one program when the experts span dp x tp devices) and the compilation counter; everything else in the
package is its internals: the start-up plan and its KVSpec, the three rooms behind ModelRunner (kv_pool,
step_inputs, compiled_step), buckets, the mesh, the start-up probes."""

from jaxpaged.runner import compile_counter
from jaxpaged.runner.lock_step import LockStepRanks
from jaxpaged.runner.model_runner import ForwardedStep, ModelRunner, build_rank_runners

__all__ = ["ForwardedStep", "LockStepRanks", "ModelRunner", "build_rank_runners", "compile_counter"]

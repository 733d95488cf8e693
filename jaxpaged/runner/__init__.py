"""The runner: the device side of an engine step. Its public face is ModelRunner (one per data-parallel rank,
built by build_rank_runners), the ForwardedStep its forward() hands to its sample(), and the compilation
counter; everything else in the package is its internals: the start-up plan and its KVSpec, the three rooms behind
ModelRunner (kv_pool, step_inputs, compiled_step), buckets, the mesh, the start-up probes."""

from jaxpaged.runner import compile_counter
from jaxpaged.runner.model_runner import ForwardedStep, ModelRunner, build_rank_runners

__all__ = ["ForwardedStep", "ModelRunner", "build_rank_runners", "compile_counter"]

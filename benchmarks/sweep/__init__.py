"""Config-driven benchmark sweeps: `jaxpaged bench configs/bench/NAME.yaml`.

A YAML file names the model, the engine options, a workload, the sweep axes (a cartesian product), the mode
(offline through LLM.generate, or online against a `jaxpaged serve` subprocess) and the peers measured on the
same workload in the same run. The runner writes one JSON file, a markdown table and PNG plots per run.

It lives outside the `jaxpaged` package: only `jaxpaged bench` imports `benchmarks.sweep.sweep.bench_main`, lazily,
and the engine, `LLM` and the server never import it (tests/bench/test_bench_outside_product.py).
"""

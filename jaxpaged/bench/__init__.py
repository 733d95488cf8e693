"""Config-driven benchmark sweeps: `jaxpaged bench configs/bench/NAME.yaml`.

A YAML file names the model, the engine options, a workload, the sweep axes (a cartesian product), the mode
(offline through LLM.generate, or online against a `jaxpaged serve` subprocess) and the peers measured on the
same workload in the same run. The runner writes one JSON file, a markdown table and PNG plots per run.

It ships in the wheel, so `jaxpaged bench` works from a plain `pip install jaxpaged[bench]` (its plots, online mode
and torch peers need the bench extra). Only `jaxpaged bench` imports `jaxpaged.bench.sweep.bench_main`, lazily; the
engine, `LLM` and the server never import it (tests/bench/test_bench_outside_product.py). The one-off studies stay in
the checkout's benchmarks/, outside the wheel.
"""

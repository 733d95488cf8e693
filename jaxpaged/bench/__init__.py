"""Config-driven benchmark sweeps: `jaxpaged bench configs/bench/NAME.yaml`.

A YAML file names the model, the engine options, a workload, the sweep axes (a cartesian product), the mode
(offline through LLM.generate, or online against a `jaxpaged serve` subprocess) and the peers measured on the
same workload in the same run. The runner writes one JSON file, a markdown table and PNG plots per run.

Only `jaxpaged.bench.sweep.bench_main` is imported by the CLI; the engine never imports this package.
"""

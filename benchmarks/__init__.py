"""Benchmarks: config-driven sweeps (`benchmarks/sweep`, run by `jaxpaged bench`) and one-off scripts.

Not part of the product: nothing under `jaxpaged/` imports this package, except `jaxpaged bench`, lazily.
"""

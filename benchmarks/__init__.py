"""Benchmarks: one-off studies and kernel checks, run from the checkout (`python -m benchmarks.<study>`).

Not part of the product and not in the wheel: nothing under `jaxpaged/` imports this package. The config-driven
sweep runner behind `jaxpaged bench` ships inside the package (jaxpaged/bench); scripts here reuse its helpers.
"""

"""Pallas kernels for TPU (Mosaic) and GPU (Triton): paged attention with its KV layouts, and the grouped matmul.

A package of its own, apart from the engine: it imports nothing of jaxpaged (tests/test_import_graph.py), so the
kernels can be read, tested and reused without it. ragged_paged_attention/: the attention kernels; grouped_matmul/:
the MoE expert matmul; kv_quantization.py: 8-bit KV rows and their scales; bfloat16_bits.py: bfloat16 held as uint16
bits; pytree.py: dataclasses as jax pytrees.
"""

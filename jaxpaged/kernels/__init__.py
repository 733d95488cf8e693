"""jaxpaged's kernels, kept apart from the engine: they import nothing of jaxpaged outside this package.

ragged_paged_attention/: attention over the paged KV cache behind one signature: the plain reference (spec.py), the
CPU path ("xla": jnp, with decode rows read by the native kernel), Pallas for TPU (Mosaic) and GPU (Triton).
cpu_native/: native C++ kernels for the CPU (paged decode attention, the packed-weight matmul), built with the
system compiler on first use and called through XLA's FFI. pytree.py and bfloat16_bits.py: shared helpers.
"""

"""The engine's kernels: the attention backend switch, its CPU path, and the native CPU kernels.

attention_dispatch.py: validates the attention inputs once and runs the chosen backend ("xla", or the Pallas kernels
of the top-level pallas_kernels package); xla_attention.py: the "xla" backend (jnp, with decode rows read by the native
kernel); cpu_native/: native C++ kernels for the CPU (paged decode attention, the packed-weight matmul), built with the
system compiler on first use and called through XLA's FFI. They import nothing of the engine outside this package but
pallas_kernels.
"""

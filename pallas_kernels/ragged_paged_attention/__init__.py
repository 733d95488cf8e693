"""Ragged paged attention over a paged KV cache: the Pallas kernels, their KV layouts and metadata, and the reference.

metadata.py: the AttentionMetadata pytree and the shared vocabulary; spec.py: the plain jnp reference every kernel is
tested against; tpu.py / tpu_decode.py: the Mosaic kernels; gpu.py: the Triton one; kv_layout*.py: the KV page
layouts (interleaved, packed and packed quantized for TPU); kv_write_tpu.py: the TPU page write. The engine's backend
switch and its CPU path live in jaxpaged/kernels (attention_dispatch.py, xla_attention.py).
"""

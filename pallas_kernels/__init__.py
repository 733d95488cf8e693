"""Attention kernels of jaxpaged: ragged paged attention for TPU (Mosaic), GPU (Triton) and CPU (XLA)."""

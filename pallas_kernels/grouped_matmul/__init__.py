"""Grouped matmul (the MoE expert computation): rows sorted by group, each group times its own weight matrix.

reference.py: the contract and its jnp reference (jax.lax.ragged_dot); tpu.py: the Mosaic kernel, with its visit
schedule (tpu_schedule.py) and block sizes (tpu_tiles.py); gpu.py: the Triton one, over its row blocks and tiles
(gpu_schedule.py); weight_layout.py: expert weights padded to whole 128-lane columns at load, which spares XLA:TPU a
per-call copy of every expert. `grouped_matmul` is the TPU kernel.
"""

from pallas_kernels.grouped_matmul.gpu import grouped_matmul_gpu
from pallas_kernels.grouped_matmul.reference import grouped_matmul_reference
from pallas_kernels.grouped_matmul.tpu import grouped_matmul_tpu as grouped_matmul
from pallas_kernels.grouped_matmul.weight_layout import lane_padded_width, pad_columns_to_lanes

__all__ = ["grouped_matmul", "grouped_matmul_gpu", "grouped_matmul_reference", "lane_padded_width",
           "pad_columns_to_lanes"]

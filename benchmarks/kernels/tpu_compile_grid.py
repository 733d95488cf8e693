"""What `make tpu-compile` compiles: real models' attention shapes x TPU chips x kernels x layouts x pages x dtypes.

The CI grid (the default) covers every shape and kernel on both chips in the packed layout the engine allocates at
every tp (per-shard shapes where named), the mixed-step branch (both kernels) at the Llama and SmolLM2 shapes, plus
the cases that were rejected or large before (interleaved Llama decode on v5e, head_dim 64 interleaved), float32,
pages 32 / 64 at the Llama shape, the int8 / fp8 packed quantized cache (both kernels at the Llama shape, decode
with [K | V] vectors and with one KV head per shard), and the window-aware kernels at 32k context (every attention
kernel: a Gemma-3-27B-shaped sliding layer, window 1024, and gpt-oss's, window 128 with attention sinks); `--full` is
the whole product (~10x longer).
"""

import dataclasses
import itertools
from typing import Optional

CHIPS = ("v5e", "v6e")
KERNELS = ("decode", "general", "mixed", "kv_write")
LAYOUTS = ("packed", "interleaved")
QUANTIZED_LAYOUTS = ("packed_int8", "packed_fp8_e4m3")
"""The packed quantized layout (kv_layout_quantized.py) of kv_cache_dtype "int8" / "fp8_e4m3"."""
PAGE_SIZES = (16, 32, 64)
DTYPES = ("bfloat16", "float32")
# One step as the issue sized it: 256 tokens, 64 sequences of up to 2k tokens, a 64k-token pool.
NUM_TOKENS = 256
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 2048
POOL_TOKENS = 65536


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """One model's attention as one device sees it (per tensor-parallel shard where named)."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: Optional[int] = None
    soft_cap: Optional[float] = None
    sinks: bool = False
    """Attention sinks (gpt-oss): one float32 logit per q head."""
    max_model_len: int = MAX_MODEL_LEN
    """The block table's width in tokens: a sliding layer reads only its window's pages of it."""

    @property
    def heads(self) -> str:
        return f"({self.num_q_heads},{self.num_kv_heads},{self.head_dim})"


SHAPES = (
    ModelShape("SmolLM2-135M", 9, 3, 64),
    ModelShape("Llama-3-8B", 32, 8, 128),
    ModelShape("Llama-3-70B/tp4", 16, 2, 128),
    ModelShape("Llama-3-70B/tp8", 8, 1, 128),
    ModelShape("Gemma-2-2B", 8, 4, 256, sliding_window=4096, soft_cap=50.0),
    ModelShape("Gemma-2-9B", 16, 8, 256, sliding_window=4096, soft_cap=50.0),
    ModelShape("Gemma-3-1B", 4, 1, 256, sliding_window=512),
    ModelShape("Gemma-3-27B", 32, 16, 128, sliding_window=1024),
    ModelShape("hd256", 8, 1, 256),
    ModelShape("Gemma-3-27B/32k", 32, 16, 128, sliding_window=1024, max_model_len=32768),
    ModelShape("gpt-oss/32k", 64, 8, 64, sliding_window=128, sinks=True, max_model_len=32768),
)
WINDOW_SHAPES = ("Gemma-3-27B/32k", "gpt-oss/32k")
"""The sliding layers at long context (window-only page reads, sinks), compiled with every attention kernel."""


@dataclasses.dataclass(frozen=True)
class CompileCase:
    """One kernel compiled for one chip at one shape, layout, page size and dtype."""

    shape: ModelShape
    chip: str
    kernel: str
    layout: str
    page_size: int
    dtype: str


def _cases(shapes, chips, kernels, layouts, pages, dtypes) -> list[CompileCase]:
    return [CompileCase(shape, chip, kernel, layout, page, dtype) for shape, chip, kernel, layout, page, dtype
            in itertools.product(shapes, chips, kernels, layouts, pages, dtypes)]


def full_grid() -> list[CompileCase]:
    """Every shape, chip, kernel, layout, page size and dtype (the quantized layouts in bfloat16)."""
    return (_cases(SHAPES, CHIPS, KERNELS, LAYOUTS, PAGE_SIZES, DTYPES)
            + _cases(SHAPES, CHIPS, KERNELS, QUANTIZED_LAYOUTS, PAGE_SIZES, ("bfloat16",)))


def ci_grid() -> list[CompileCase]:
    """The representative subset CI compiles (every shape and kernel once per chip, plus the known-hard cases)."""
    by_name = {shape.name: shape for shape in SHAPES}
    llama, smol = by_name["Llama-3-8B"], by_name["SmolLM2-135M"]
    attention = ("decode", "general")
    short = tuple(shape for shape in SHAPES if shape.name not in WINDOW_SHAPES)
    cases = _cases(short, CHIPS, ("decode", "general", "kv_write"), ("packed",), (16,), ("bfloat16",))
    cases += _cases(tuple(by_name[name] for name in WINDOW_SHAPES), CHIPS, ("decode", "general", "mixed"),
                    ("packed",), (16,), ("bfloat16",))
    cases += _cases((llama, smol), CHIPS, ("mixed",), ("packed",), (16,), ("bfloat16",))
    cases += _cases((llama, smol), CHIPS, attention, ("interleaved",), (16,), ("bfloat16",))
    cases += _cases((llama,), CHIPS, attention, ("packed",), (16,), ("float32",))
    cases += _cases((llama,), CHIPS, attention, ("packed",), (32, 64), ("bfloat16",))
    cases += _cases((llama,), CHIPS, attention, QUANTIZED_LAYOUTS, (16,), ("bfloat16",))
    cases += _cases((llama,), ("v6e",), ("kv_write",), QUANTIZED_LAYOUTS, (16,), ("bfloat16",))
    cases += _cases((smol, by_name["Llama-3-70B/tp8"]), ("v6e",), ("decode",), ("packed_int8",), (16,), ("bfloat16",))
    return cases

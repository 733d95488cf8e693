"""Compile every TPU kernel with libtpu for v5e / v6e topologies on a CPU-only machine (`make tpu-compile`).

Interpret mode and MLIR lowering never run libtpu's Mosaic passes; this does. JAX compiles ahead of time
for a TPU topology without a TPU: inputs are ShapeDtypeStructs placed on one of the topology's devices,
and the topology's device is the default device while tracing, so Pallas (`pltpu.get_tpu_info()`) and the
kernels' VMEM plans read that chip. Prints one row per case: OK or the compiler's message, the VMEM limit
the kernel asked for and its block plan, HBM argument and temporary bytes as XLA:TPU planned them
(`compiled.memory_analysis()`). Then the engine's whole step sharded over a v5e-8 / v6e-8 mesh
(tpu_step_compile.py), with the memory plan checked against XLA:TPU's HBM. Exits 1 on any rejection.

    .venv-tpu/bin/python -m benchmarks.kernels.tpu_compile_check [--full] [--chips v5e] [--shapes Llama-3-8B]
        [--no-step]
"""

import argparse
import dataclasses
import functools
import importlib.metadata
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.kernels.tpu_compile_grid import (
    CHIPS,
    MAX_NUM_SEQS,
    NUM_TOKENS,
    POOL_TOKENS,
    QUANTIZED_LAYOUTS,
    CompileCase,
    ci_grid,
    full_grid,
)
from benchmarks.kernels.tpu_step_compile import STEP_COLUMNS, compile_step, step_cases
from pallas_kernels.kv_quantization import quantized_pool_dtype
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape
from pallas_kernels.ragged_paged_attention.kv_layout_packed import packed_layout_for
from pallas_kernels.ragged_paged_attention.kv_layout_quantized import quantized_layout_for, write_kv_packed_quantized
from pallas_kernels.ragged_paged_attention.kv_write_tpu import write_kv_pages_tpu
from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata
from pallas_kernels.ragged_paged_attention.tpu import ragged_paged_attention_tpu
from pallas_kernels.ragged_paged_attention.tpu_vmem import (
    decode_pages_per_block,
    default_vmem_limit_bytes,
    prefill_blocks,
)

MIB = 1024 * 1024
COLUMNS = ("model", "heads", "chip", "kernel", "layout", "dtype", "page", "result", "vmem_limit", "block",
           "hbm_args", "hbm_temp", "seconds")


def _kv_cache_dtype(case: CompileCase) -> str:
    """"auto", or the quantized format of a packed quantized case ("packed_int8" -> "int8")."""
    return case.layout[len("packed_"):] if case.layout in QUANTIZED_LAYOUTS else "auto"


def _step_function(case: CompileCase):
    """(function, abstract args) of one kernel call at the grid's step size."""
    shape, page_size, dtype = case.shape, case.page_size, jnp.dtype(case.dtype)
    kv_heads, head_dim = shape.num_kv_heads, shape.head_dim
    kv_cache_dtype = _kv_cache_dtype(case)
    if kv_cache_dtype == "auto":
        kv_pages = cache_shape(POOL_TOKENS // page_size, page_size, kv_heads, head_dim, dtype, case.layout)
    else:
        kv_pages = cache_shape(POOL_TOKENS // page_size, page_size, kv_heads, head_dim,
                               quantized_pool_dtype(kv_cache_dtype), "packed_quantized")
    quantized = dict(kv_cache_dtype=kv_cache_dtype, page_size=page_size) if kv_cache_dtype != "auto" else {}
    int32 = lambda *dims: (dims, jnp.int32)  # noqa: E731
    if case.kernel == "kv_write":
        k = ((NUM_TOKENS, kv_heads, head_dim), dtype)
        write = (functools.partial(write_kv_packed_quantized, **quantized) if quantized
                 else functools.partial(write_kv_pages_tpu, interpret=False))
        return write, (kv_pages, k, k, int32(NUM_TOKENS))
    pages_per_seq = shape.max_model_len // page_size
    fields = (int32(NUM_TOKENS), int32(MAX_NUM_SEQS), int32(MAX_NUM_SEQS, pages_per_seq),
              int32(MAX_NUM_SEQS + 1), int32(1))
    sinks = (((shape.num_q_heads,), jnp.float32),) if shape.sinks else ()

    def attend(q, kv, *fields_and_sinks):
        return ragged_paged_attention_tpu(
            q, kv, AttentionMetadata(*fields_and_sinks[:5]), sm_scale=head_dim ** -0.5,
            sliding_window=shape.sliding_window, soft_cap=shape.soft_cap,
            sinks=fields_and_sinks[5] if shape.sinks else None, case=case.kernel, num_kv_heads=kv_heads,
            interpret=False, **quantized)
    return attend, (((NUM_TOKENS, shape.num_q_heads, head_dim), dtype), kv_pages, *fields, *sinks)


def _layout(case: CompileCase):
    if case.layout in QUANTIZED_LAYOUTS:
        return quantized_layout_for(case.shape.num_kv_heads, case.shape.head_dim, _kv_cache_dtype(case),
                                    case.page_size)
    return packed_layout_for(case.shape.num_kv_heads, case.shape.head_dim, case.dtype) \
        if case.layout == "packed" else None


def _block_plan(case: CompileCase, vmem_limit: int) -> str:
    """The kernel's own plan at this case: pages per decode DMA block or per tile-kernel chunk."""
    if case.kernel == "mixed":
        return f"{_block_plan(dataclasses.replace(case, kernel='decode'), vmem_limit)} + " \
               f"{_block_plan(dataclasses.replace(case, kernel='general'), vmem_limit)}"
    if case.kernel == "general":
        q_block, pages = prefill_blocks(NUM_TOKENS, case.page_size, case.shape.num_q_heads, case.shape.num_kv_heads,
                                        case.shape.head_dim, case.dtype, _layout(case), vmem_limit)
        return f"{q_block}q x {pages}p"
    if case.kernel == "decode":
        return f"{decode_pages_per_block(case.page_size, case.shape.max_model_len // case.page_size, case.shape.num_kv_heads, case.shape.head_dim, case.dtype, _layout(case), vmem_limit)}p"  # noqa: E501
    return "-"


def _message(error: Exception) -> str:
    """The compiler's own words, on one line: its first line naming the failure, and the line sizing it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    sizing = [line for line in lines if "exceeded" in line or "size" in line.lower()]
    return " | ".join(dict.fromkeys(lines[:1] + sizing[:1]))[:240]


def compile_case(case: CompileCase, device) -> dict:
    """Compile one case for `device` (a topology's TPU device); the table row."""
    row = dict(model=case.shape.name, heads=case.shape.heads, chip=case.chip, kernel=case.kernel,
               layout=case.layout, dtype=case.dtype, page=case.page_size)
    started = time.perf_counter()
    sharding = jax.sharding.SingleDeviceSharding(device)
    with jax.default_device(device):
        vmem_limit = default_vmem_limit_bytes()
        row |= dict(vmem_limit=f"{vmem_limit / MIB:.0f}M", block=_block_plan(case, vmem_limit))
        function, args = _step_function(case)
        abstract = [jax.ShapeDtypeStruct(dims, dtype, sharding=sharding) for dims, dtype in args]
        try:
            stats = jax.jit(function).lower(*abstract).compile().memory_analysis()
            assert stats is not None, "XLA:TPU plans memory for every executable"
            row |= dict(result="OK", hbm_args=f"{stats.argument_size_in_bytes / MIB:.1f}M",
                        hbm_temp=f"{stats.temp_size_in_bytes / MIB:.2f}M")
        except Exception as error:  # noqa: BLE001 - the compiler's rejection is the row's result
            row |= dict(result=_message(error), hbm_args="-", hbm_temp="-")
    row["seconds"] = f"{time.perf_counter() - started:.1f}"
    return row


def print_table(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> None:
    """One markdown table (docs/tpu-compile.md keeps it)."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[column]) for column in columns) + " |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Compile every TPU kernel with libtpu for TPU topologies.")
    parser.add_argument("--full", action="store_true", help="every shape x chip x kernel x layout x page x dtype")
    parser.add_argument("--chips", nargs="+", help="only these chips (v5e, v6e)")
    parser.add_argument("--shapes", nargs="+", help="only these model shapes (names as in tpu_compile_grid.py)")
    parser.add_argument("--no-step", action="store_true",
                        help="skip the whole sharded step (tpu_step_compile.py) and its memory-plan check")
    options = parser.parse_args(argv)
    from jax.experimental import topologies

    cases = full_grid() if options.full else ci_grid()
    cases = [case for case in cases if (not options.chips or case.chip in options.chips)
             and (not options.shapes or case.shape.name in options.shapes)]
    libtpu = importlib.metadata.version("libtpu")  # the TPU compiler this check proves the kernels against
    print(f"jax {jax.__version__}, libtpu {libtpu}: {len(cases)} compiles", flush=True)
    started = time.perf_counter()
    rows = []
    for chip in dict.fromkeys(case.chip for case in cases):
        device = topologies.get_topology_desc(topology_name=f"{chip}:2x2", platform="tpu").devices[0]
        rows += [compile_case(case, device) for case in cases if case.chip == chip]
    print_table(rows)
    steps = [] if options.no_step else [compile_step(case) for case in step_cases(
        [chip for chip in CHIPS if not options.chips or chip in options.chips])]
    if steps:
        print_table(steps, STEP_COLUMNS)
    rejected = [row for row in rows + steps if not row["result"].startswith("OK")]
    print(f"{len(rows) + len(steps) - len(rejected)}/{len(rows) + len(steps)} compiled in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())

"""The engine's step with LoRA adapter slots compiled by libtpu for a v5e-8 / v6e-8 mesh on a CPU-only machine: the
runner's forward_step over a model whose projections read 4 adapters + slot 0 of rank 16 (stacked bfloat16 layers,
as a TPU runs them), the slots split as lora/slots.py splits them at tp 8. Prints one line per case, exits 1 on a
rejection.

    .venv-tpu/bin/python -m benchmarks.kernels.tpu_lora_step_compile [--chips v5e v6e] [--shapes tiny Llama-3-8B]
"""

import argparse
import functools
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.kernels import tpu_step_compile as step_compile
from jaxpaged.lora.peft_adapter import projection_dims
from jaxpaged.lora.slot_names import lora_a_name, lora_b_name
from jaxpaged.models.layers import paged_attention
from jaxpaged.models.llama import DecoderLayers, LlamaForCausalLM
from jaxpaged.models.param_shapes import param_shapes
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.batch import PackedLayout, empty_step_inputs, pack_step_inputs
from jaxpaged.runner.compiled_step import forward_step
from jaxpaged.runner.kv_spec import build_kv_spec

NUM_SLOTS, RANK, TP = 5, 16, 8
_ROW_PARALLEL = ("o_proj", "down_proj")


def _lora_spec(name: str) -> P:
    """lora/slots.py's split of one stacked slot array [layers, slots, ...] at tp > 1."""
    row_parallel = name.split(".", 1)[1] in _ROW_PARALLEL
    if name.startswith("lora_a"):
        return P(None, None, None, mesh_lib.MODEL_AXIS if row_parallel else None)
    return P(None, None, None if row_parallel else mesh_lib.MODEL_AXIS, None)


def compile_lora_step(model_name: str, chip: str) -> str:
    """One case's line: the compile's HBM arguments and temporaries, or the compiler's message."""
    model, dtype = step_compile.STEP_MODELS[model_name], jnp.dtype("bfloat16")
    mesh = step_compile._mesh(chip, TP)
    plan = step_compile._plan(model, TP, dtype)
    lora = {}
    for target, (inner, outer) in projection_dims(model).items():  # bfloat16 stacks are held as uint16 bits
        lora[lora_a_name(target)] = jax.ShapeDtypeStruct((model.num_layers, NUM_SLOTS, RANK, inner), jnp.uint16)
        lora[lora_b_name(target)] = jax.ShapeDtypeStruct((model.num_layers, NUM_SLOTS, outer, RANK), jnp.uint16)

    def build(params):
        built = LlamaForCausalLM(model, params)
        built.lora = nnx.data(DecoderLayers(lora))  # pyright: ignore[reportAttributeAccessIssue]
        return built

    started = time.perf_counter()
    try:
        with jax.default_device(mesh.devices.flat[0]):
            shapes = param_shapes(model)
            abstract = nnx.eval_shape(build, {name: jax.ShapeDtypeStruct(shape, dtype)
                                              for name, shape in shapes.items()})
            graphdef, state = nnx.split(abstract)
            state = nnx.to_pure_dict(state)
            placed: dict[str, Any] = {key: step_compile._placed(value, key, model, mesh)
                                      for key, value in state.items() if key not in ("layers", "lora")}
            placed["layers"] = {name: step_compile._placed(value, f"layers.{name}", model, mesh)
                                for name, value in state["layers"].items()}
            placed["lora"] = {name: jax.ShapeDtypeStruct(value.shape, value.dtype,
                                                         sharding=NamedSharding(mesh, _lora_spec(name)))
                              for name, value in state["lora"].items()}
            kv_spec = build_kv_spec(model, step_compile.BLOCK_SIZE, dtype, plan.layout, "auto", TP, "tpu")
            kv_sharding = NamedSharding(mesh, mesh_lib.kv_cache_spec(plan.layout))
            kv_cache = jax.ShapeDtypeStruct(kv_spec.pool_shape(plan.num_kv_blocks), kv_spec.pool_dtype,
                                            sharding=kv_sharding)
            attend = mesh_lib.shard_attention(functools.partial(
                paged_attention, backend="pallas_tpu", native_decode=False, kv_cache_dtype="auto",
                page_size=step_compile.BLOCK_SIZE), mesh)
            replicated = mesh_lib.replicated(mesh)
            jitted = jax.jit(functools.partial(forward_step, graphdef, attend), donate_argnums=(1,),
                             static_argnums=(4,),
                             in_shardings=(jax.tree.map(lambda x: x.sharding, placed), kv_sharding, replicated,
                                           replicated),
                             out_shardings=(replicated, kv_sharding, replicated))
            example = empty_step_inputs(step_compile.NUM_TOKENS, step_compile.MAX_NUM_SEQS,
                                        -(-step_compile.MAX_MODEL_LEN // step_compile.BLOCK_SIZE))
            packed = pack_step_inputs(example)
            batch = jax.ShapeDtypeStruct(packed.shape, packed.dtype, sharding=replicated)
            previous = jax.ShapeDtypeStruct((step_compile.MAX_NUM_SEQS,), jnp.int32, sharding=replicated)
            compiled = jitted.lower(placed, kv_cache, batch, previous, PackedLayout.of(example)).compile()
            stats = compiled.memory_analysis()
        assert stats is not None
        return (f"OK  {model_name} step + LoRA ({NUM_SLOTS - 1} adapters, rank {RANK}) on {chip}-8 tp {TP}: HBM "
                f"arguments {stats.argument_size_in_bytes / 2**20:.0f} MiB, temporaries "
                f"{stats.temp_size_in_bytes / 2**20:.0f} MiB ({time.perf_counter() - started:.0f} s)")
    except Exception as error:  # noqa: BLE001 - the compiler's rejection is the case's result
        return f"REJECTED  {model_name} on {chip}-8: {str(error).splitlines()[0][:240]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chips", nargs="+", default=["v5e"])
    parser.add_argument("--shapes", nargs="+", default=list(step_compile.STEP_MODELS))
    options = parser.parse_args(argv)
    lines = [compile_lora_step(shape, chip) for chip in options.chips for shape in options.shapes]
    print("\n".join(lines))
    return 1 if any(line.startswith("REJECTED") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())

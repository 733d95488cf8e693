"""A roofline for a workload on the machine at hand, measured in the same run as the systems it judges.

The machine's rates: dot throughput at the step's own shapes (decode rows and a prefill bucket, float32 and
bfloat16 inputs with float32 accumulation, and int8 x int8 with int32 sums; on a CPU, the better of XLA's dot and the
native packed matmul where the steps run it, in int8 the native VNNI matmul where it builds) and the bandwidth of a
plain numpy copy; the sweep measures them twice, minutes apart, and keeps the better of each
(MachineRates.best_of). The workload's lower bound:
  - prefill: its matmul and attention FLOPs at the prefill-shaped dot rate;
  - decode: per step, the larger of its FLOPs at the decode-shaped dot rate and its bytes (every weight once per
    step, plus every KV byte the step's sequences attend over) at the copy bandwidth; the steps are at least the
    longest output and at least the decode tokens over max_num_seqs.
With int8 projections (quantization "int8" or "w8a8") the int8 roofline: the projections' multiply-adds at the int8
dot rate (one int8 multiply-add per weight's: the bound w8a8 could reach; weight-only int8's int16 digits take two,
so it can reach at most half of it) and their bytes at one per weight; attention and the vocabulary projection stay
in the model dtype.
A system's fraction of the roofline is lower bound / its measured duration (1.0 would be the machine's limit).
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np

from jaxpaged.bench.workloads import BenchRequest
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.timing import call_seconds

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class MachineRates:
    """Measured rates of this machine (the best of the repeats: a roofline is a peak, and other jobs on a shared
    machine can only slow a repeat down, so the median would let noise lower the bound)."""

    copy_bytes_per_s: float
    """numpy copy of a 256 MiB array: bytes copied per second."""
    dot_flops_per_s: dict[str, dict[str, float]]
    """dtype ("float32", "bfloat16", "int8") -> {"decode": rate at decode rows, "prefill": rate at prefill rows};
    int8's in int8 operations (two per multiply-add, as FLOPs count)."""

    def best_of(self, other: "MachineRates") -> "MachineRates":
        """Each rate at the better of two measurements (made minutes apart: a neighbour's burst on a shared machine
        can slow every repeat of one of them, once a bfloat16 dot rate to half)."""
        dots = {dtype: {phase: max(rate, other.dot_flops_per_s[dtype][phase]) for phase, rate in phases.items()}
                for dtype, phases in self.dot_flops_per_s.items()}
        return MachineRates(max(self.copy_bytes_per_s, other.copy_bytes_per_s), dots)


REPEATS = 15
"""Timed repeats of each rate; the best one counts."""
COPY_BYTES = 256 * 2**20
"""Bytes the copy-bandwidth measurement copies: far more than any CPU cache."""


def _run_dot(dot, x, weight) -> None:
    dot(x, weight).block_until_ready()


def copy_bytes_per_s(repeats: int, statistic: Callable[[list[float]], float] = min) -> float:
    """Bandwidth of np.copyto between two COPY_BYTES arrays (bytes copied per second), from `statistic` of the
    repeats' seconds: the best by default, as a roofline wants."""
    source = np.random.default_rng(0).standard_normal(COPY_BYTES // 8)
    target = np.empty_like(source)
    return COPY_BYTES / statistic(call_seconds(lambda: np.copyto(target, source), repeats))


def measure_rates(model: ModelConfig, *, decode_rows: int, prefill_rows: int, repeats: int = REPEATS) -> MachineRates:
    """Copy bandwidth, and dot throughput at [rows, hidden] x [hidden, intermediate] (the MLP's shape) in float32,
    in bfloat16 with float32 accumulation and in int8 with int32 sums; on a CPU, the better of XLA's dot and the
    native packed matmul in each float dtype it is built for, and in int8 of XLA's int8 dot and the native VNNI
    matmul where it builds (a roofline must bound what a step can reach, and CPU steps run the native ones)."""
    import jax
    import jax.numpy as jnp

    from jaxpaged.kernels.cpu_native.packed_matmul import fills_whole_panels, pack_panels, packed_matmul
    from jaxpaged.kernels.cpu_native.vnni_matmul import pack_vnni, packs_for_vnni, vnni_available, vnni_matmuls
    from jaxpaged.models.packed_weights import packs_weights_on

    copy_rate = copy_bytes_per_s(repeats)
    rates: dict[str, dict[str, float]] = {}
    hidden, inter = model.hidden_size, model.intermediate_size
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    for dtype in ("float32", "bfloat16"):
        rates[dtype] = {}
        weight = jnp.asarray(np.random.default_rng(1).standard_normal((hidden, inter)), dtype)
        paths = [(dot, weight)]
        if packs_weights_on(jax.default_backend(), dtype, 1) and fills_whole_panels(weight.shape, dtype):
            paths.append((jax.jit(packed_matmul), jnp.asarray(pack_panels(np.asarray(weight)))))
        for phase, rows in (("decode", decode_rows), ("prefill", prefill_rows)):
            x = jnp.asarray(np.random.default_rng(2).standard_normal((rows, hidden)), dtype)
            seconds = min(min(call_seconds(functools.partial(_run_dot, run, x, operand), repeats))
                          for run, operand in paths)
            rates[dtype][phase] = 2 * rows * hidden * inter / seconds
    int8_dot = jax.jit(lambda a, b: jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                                                        preferred_element_type=jnp.int32))
    weight = jnp.asarray(np.random.default_rng(1).integers(-127, 128, (hidden, inter)), jnp.int8)
    int8_paths = [(int8_dot, weight)]
    if jax.default_backend() == "cpu" and vnni_available() and packs_for_vnni(weight.shape):
        # w8a8 steps run the native VNNI matmul where the start-up plan times it faster (XLA's int8 dot is slow on
        # Zen 4's VNNI): the bound must cover it.
        ones = jnp.ones(inter, jnp.float32)
        vnni = jax.jit(lambda a, p: vnni_matmuls(a, jnp.ones((a.shape[0], 1), jnp.float32), [p], [ones])[0])
        int8_paths.append((vnni, jnp.asarray(pack_vnni(np.asarray(weight)))))
    rates["int8"] = {}
    for phase, rows in (("decode", decode_rows), ("prefill", prefill_rows)):
        x = jnp.asarray(np.random.default_rng(2).integers(-127, 128, (rows, hidden)), jnp.int8)
        seconds = min(min(call_seconds(functools.partial(_run_dot, run, x, operand), repeats))
                      for run, operand in int8_paths)
        rates["int8"][phase] = 2 * rows * hidden * inter / seconds
    return MachineRates(copy_rate, rates)


def matmul_params_per_token(model: ModelConfig) -> int:
    """Weights every token multiplies through, all layers (the vocabulary projection is counted per sampled row)."""
    hidden = model.hidden_size
    q_width, kv_width = model.num_q_heads * model.head_dim, model.num_kv_heads * model.head_dim
    per_layer = hidden * (q_width + 2 * kv_width) + q_width * hidden + 3 * hidden * model.intermediate_size
    return model.num_layers * per_layer


def weight_bytes(model: ModelConfig, dtype: str, quantized: bool = False) -> int:
    """Bytes of the weights a decode step reads: every layer's matrices (one byte each when `quantized`, the int8
    projections' per-column scales left out: under 0.3 % of them) and the vocabulary projection."""
    projection_bytes = 1 if quantized else DTYPE_BYTES[dtype]
    return (matmul_params_per_token(model) * projection_bytes
            + model.vocab_size * model.hidden_size * DTYPE_BYTES[dtype])


def lower_bound_seconds(model: ModelConfig, requests: Sequence[BenchRequest], rates: MachineRates, dtype: str,
                        max_num_seqs: int, quantization: Optional[str] = None) -> dict[str, float]:
    """The workload's lower bound (see the module docstring) and its parts, in seconds; `quantization` (a row's
    "int8" / "w8a8", or None) puts the projections at the int8 rate and bytes."""
    params = matmul_params_per_token(model)
    attention_flops_per_kv = 4 * model.num_q_heads * model.head_dim * model.num_layers  # QK^T and PV per KV token
    kv_bytes_per_token = 2 * model.num_kv_heads * model.head_dim * model.num_layers * DTYPE_BYTES[dtype]
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    # Projection FLOPs and the rest (attention, the vocabulary projection): they may run at different rates.
    prefill_projection_flops = sum(2 * params * n for n in prompt_lens)
    prefill_other_flops = sum(attention_flops_per_kv * n * (n + 1) // 2 + 2 * model.hidden_size * model.vocab_size
                              for n in prompt_lens)
    decode_projection_flops = decode_other_flops = decode_kv_bytes = 0
    for request, n in zip(requests, prompt_lens):
        for step in range(1, request.max_tokens):  # the first token comes out of the prefill
            context = n + step
            decode_projection_flops += 2 * params
            decode_other_flops += attention_flops_per_kv * context + 2 * model.hidden_size * model.vocab_size
            decode_kv_bytes += context * kv_bytes_per_token
    decode_tokens = sum(max(r.max_tokens - 1, 0) for r in requests)
    num_steps = max(max((r.max_tokens - 1 for r in requests), default=0), -(-decode_tokens // max_num_seqs))
    rate, projection_rate = rates.dot_flops_per_s[dtype], rates.dot_flops_per_s["int8" if quantization else dtype]
    prefill_s = (prefill_projection_flops / projection_rate["prefill"] + prefill_other_flops / rate["prefill"])
    decode_compute_s = decode_projection_flops / projection_rate["decode"] + decode_other_flops / rate["decode"]
    decode_memory_s = (num_steps * weight_bytes(model, dtype, quantization is not None)
                       + decode_kv_bytes) / rates.copy_bytes_per_s
    return {"roofline_s": prefill_s + max(decode_compute_s, decode_memory_s), "roofline_prefill_s": prefill_s,
            "roofline_decode_compute_s": decode_compute_s, "roofline_decode_memory_s": decode_memory_s}

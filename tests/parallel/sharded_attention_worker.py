"""Runs in a subprocess with 2 forced CPU devices: the KV write and attention of pallas_tpu (the TPU interpreter) per
shard over the packed KV layout at tp 1 and tp 2, against the float64 spec.

Usage: JAX_NUM_CPU_DEVICES=2 python -m tests.parallel.sharded_attention_worker
Prints one JSON line: per (shape, dtype, step kind, tp), the output's max error against spec.py, whether the written
pool unpacks to the spec's write exactly (the other layer untouched), and how the runner's sharding splits the pool
over the devices (each device's rows are its shard's packed heads).
"""

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxpaged.kernels.attention_dispatch import ragged_paged_attention, write_kv
from jaxpaged.runner import mesh as mesh_lib
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.kv_layout import cache_shape
from pallas_kernels.ragged_paged_attention.kv_layout_packed import pack_kv_pages, unpack_kv_pages
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec, write_kv_spec

PAGE = 16
# (q heads, kv heads, head_dim, dtype): [K | V] in one vector at head_dim 64 (2 kv heads per shard at tp 2), one
# kv head per shard at head_dim 128.
SHAPES = [(8, 4, 64, "bfloat16"), (4, 2, 128, "float32")]
# Edge lengths: 1 token, a page + 1, exactly a page, many pages; a mixed step and a decode-only one.
STEPS = {"mixed": ([1, 17, 1, 5], [1, PAGE + 1, PAGE, 3 * PAGE + 7]),
         "decode": ([1, 1, 1], [1, PAGE + 1, 3 * PAGE - 1])}
# Both step kinds padded to the same pool and block tables (the mixed step's: 4 pages at most per sequence, 8 in all
# plus the null page), so their kernels are the same programs: each compile of the TPU interpreter's attention is
# seconds of CPU, and the outputs and pool contents compared do not depend on unused padding pages.
PAGES_PER_SEQ = max(-(-kv_len // PAGE) for _, kv_lens in STEPS.values() for kv_len in kv_lens)
NUM_PAGES = max(sum(-(-kv_len // PAGE) for kv_len in kv_lens) for _, kv_lens in STEPS.values()) + 1


def run_case(num_q_heads: int, num_kv_heads: int, head_dim: int, dtype_name: str, step: str, tp: int) -> dict:
    dtype = jnp.dtype(dtype_name)
    q_lens, kv_lens = STEPS[step]
    batch = make_ragged_batch(q_lens, kv_lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                              head_dim=head_dim, page_size=PAGE, dtype=dtype, num_tokens=32, max_num_seqs=4,
                              pages_per_seq=PAGES_PER_SEQ, num_pages=NUM_PAGES, seed=5)
    rng = np.random.default_rng(1)
    k, v = (rng.standard_normal((32, num_kv_heads, head_dim)).astype(dtype) for _ in range(2))
    num_pages = batch.kv_pages.shape[0]
    other_layer = rng.standard_normal(batch.kv_pages.shape).astype(dtype)
    # Two layers stacked as the model keeps them; the step addresses the second (first_page = num_pages).
    interleaved = np.concatenate([other_layer, batch.kv_pages])
    mesh = mesh_lib.rank_meshes(tp, 1)[0]
    host_packed = pack_kv_pages(jnp.asarray(interleaved), tp)
    assert (host_packed.shape, host_packed.dtype) == cache_shape(2 * num_pages, PAGE, num_kv_heads, head_dim, dtype,
                                                                 "packed", tp)
    pages_spec = P(*mesh_lib.kv_cache_spec("packed")[1:])  # the pool's split less its layer axis
    packed = jax.device_put(host_packed, jax.sharding.NamedSharding(mesh, pages_spec))
    # The second layer's pages; host arrays, so no eager device op runs beside the interpreter's callbacks.
    metadata = dataclasses.replace(batch.metadata, slot_mapping=batch.slot_mapping + num_pages * PAGE,
                                   block_tables=batch.block_tables + num_pages)
    # Each device runs on its own shard what mesh.shard_attention runs per shard: the write, then the attention of its
    # q heads. NOTE: one device at a time: the TPU interpreter deadlocks on these kernels inside a multi-device program
    # (both devices block in its buffer allocation callback); on a TPU it is one program, which
    # benchmarks/kernels/tpu_compile_check.py compiles sharded (Llama-3-8B at tp 8).
    kv_per_shard, q_per_shard = num_kv_heads // tp, num_q_heads // tp
    outs, pools, shard_exact = {}, {}, True
    for shard in packed.addressable_shards:
        rows = shard.data.shape[1]
        number = (shard.index[1].start or 0) // rows
        shard_exact &= bool(np.array_equal(np.asarray(shard.data), np.asarray(host_packed[:, rows * number:
                                                                                           rows * (number + 1)])))
        own = lambda array, per, n=number, d=shard.device: jax.device_put(array[:, per * n:per * (n + 1)], d)  # noqa: E731
        device_metadata = jax.device_put(metadata, shard.device)
        pools[number] = jax.block_until_ready(write_kv(shard.data, own(k, kv_per_shard), own(v, kv_per_shard),
                                                       device_metadata, backend="pallas_tpu"))
        outs[number] = np.asarray(ragged_paged_attention(own(batch.q, q_per_shard), pools[number], device_metadata,
                                                         backend="pallas_tpu", sm_scale=0.125,
                                                         num_kv_heads=kv_per_shard))
    out = np.concatenate([outs[number] for number in range(tp)], axis=1)
    written = np.concatenate([np.asarray(pools[number]) for number in range(tp)], axis=1)
    expected_pages = write_kv_spec(batch.kv_pages, k, v, batch.slot_mapping)
    expected = ragged_paged_attention_spec(batch.q, expected_pages, batch.metadata, sm_scale=0.125)
    unpacked = np.asarray(unpack_kv_pages(jnp.asarray(written), num_kv_heads, head_dim, dtype, tp))
    num_real = int(batch.cu_q_lens[len(q_lens)])
    return dict(shape=[num_q_heads, num_kv_heads, head_dim], dtype=dtype_name, step=step, tp=tp,
                max_error=float(np.max(np.abs(np.asarray(out, np.float64)[:num_real] - expected[:num_real]))),
                padding_rows_zero=bool(np.all(np.asarray(out)[num_real:] == 0)),
                # The null page (the layer's page 0) takes every padding row's write, in any order.
                written_exact=bool(np.array_equal(unpacked[num_pages + 1:], expected_pages[1:].astype(dtype))),
                other_layer_untouched=bool(np.array_equal(unpacked[:num_pages], other_layer)),
                pool_devices=len(packed.sharding.device_set), shards_hold_their_rows=shard_exact,
                shard_rows=packed.sharding.shard_shape(packed.shape)[1], rows=packed.shape[1])


def main() -> None:
    """argv: the dtype whose shape to run (SHAPES' last field); every shape without one."""
    shapes = [shape for shape in SHAPES if len(sys.argv) < 2 or shape[-1] == sys.argv[1]]
    results = [run_case(*shape, step, tp) for shape in shapes for step in STEPS for tp in (1, 2)]
    print(json.dumps(results))


if __name__ == "__main__":
    main()

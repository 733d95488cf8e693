"""Runs in a subprocess with 2 forced CPU devices: layers.paged_attention with attention sinks, wrapped per shard by
mesh.shard_attention at tp 2, against the float64 spec with the whole layer's sinks (each shard must get its own q
heads' sinks). Prints "ok" on success; an assertion error otherwise.

Usage: JAX_NUM_CPU_DEVICES=2 python -m tests.kernels.sinks_shard_worker
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxpaged.models.layers import paged_attention
from jaxpaged.runner import mesh as mesh_lib
from pallas_kernels.ragged_paged_attention.example_batch import make_ragged_batch
from pallas_kernels.ragged_paged_attention.spec import ragged_paged_attention_spec, write_kv_spec

PAGE = 16


def main() -> None:
    assert len(jax.devices()) == 2, jax.devices()
    batch = make_ragged_batch([1, 6, 1], [PAGE + 1, 2 * PAGE + 3, 40], num_q_heads=4, num_kv_heads=2, head_dim=64,
                              page_size=PAGE, num_tokens=16, max_num_seqs=4, seed=2)
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((16, 2, 64)).astype(np.float32) for _ in range(2))
    # Very different sinks per head, so a shard reading the other shard's would be far off.
    sinks = np.array([-3.0, 4.0, 0.5, 6.0], np.float32)
    mesh = mesh_lib.rank_meshes(2, 1)[0]
    attend = mesh_lib.shard_attention(functools.partial(paged_attention, backend="xla"), mesh)
    q, kv_pages, metadata = batch.attention_args()
    out, _ = jax.jit(lambda q, k, v, kv_pages, metadata, sinks: attend(
        q, k, v, kv_pages, jnp.int32(0), metadata, sinks=sinks, sm_scale=0.125))(
            q, jnp.asarray(k), jnp.asarray(v), kv_pages, metadata, jnp.asarray(sinks))
    written = write_kv_spec(batch.kv_pages, k, v, batch.slot_mapping)
    expected = ragged_paged_attention_spec(batch.q, written, batch.metadata, sm_scale=0.125, sinks=sinks)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5)
    print("ok")


if __name__ == "__main__":
    main()

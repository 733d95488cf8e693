"""A step's inputs travel to the device as one int32 array (runner/batch.py): packing and the static slices that
cut it back into StepInputs inside the jitted step give every field back, at every bucket shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpaged.runner.batch import PackedLayout, empty_step_inputs, pack_step_inputs, unpack_step_inputs


@pytest.mark.parametrize("num_tokens,num_seqs,blocks_per_seq", [(1, 1, 1), (16, 4, 3), (64, 64, 32)])
def test_every_field_comes_back_from_the_packed_array(num_tokens, num_seqs, blocks_per_seq):
    batch = empty_step_inputs(num_tokens, num_seqs, blocks_per_seq)
    leaves, treedef = jax.tree.flatten(batch)
    rng = np.random.default_rng(num_tokens)
    filled = [rng.integers(-5, 10**6, leaf.shape).astype(np.int32) for leaf in leaves]  # every field its own values
    batch = jax.tree.unflatten(treedef, filled)
    layout = PackedLayout.of(batch)
    packed = pack_step_inputs(batch)
    assert packed.dtype == np.int32 and packed.shape == (sum(leaf.size for leaf in filled),)
    unpacked = jax.jit(unpack_step_inputs, static_argnums=1)(jnp.asarray(packed), layout)
    got = jax.tree.leaves(unpacked)
    assert jax.tree.structure(unpacked) == treedef
    for expected, value in zip(filled, got):
        assert value.shape == expected.shape
        np.testing.assert_array_equal(np.asarray(value), expected)


def test_a_layout_is_one_static_key_per_bucket():
    # The compiled step is looked up by its static layout: equal for batches of one bucket, distinct across buckets.
    a, b = PackedLayout.of(empty_step_inputs(16, 4, 3)), PackedLayout.of(empty_step_inputs(16, 4, 3))
    assert a == b and hash(a) == hash(b)
    assert PackedLayout.of(empty_step_inputs(32, 4, 3)) != a
    assert PackedLayout.of(empty_step_inputs(16, 8, 3)) != a


def test_an_empty_batch_is_already_packed_and_a_replaced_field_is_still_sent():
    batch = empty_step_inputs(8, 2, 3)
    batch.attention.kv_lens[1] = 7  # written in place, as fill_step_inputs does
    packed = pack_step_inputs(batch)
    assert packed is np.asarray(batch.token_ids).base  # the fields are views of the array that is sent: no copy
    leaves = jax.tree.leaves(batch)
    np.testing.assert_array_equal(packed, np.concatenate([leaf.reshape(-1) for leaf in leaves]))
    assert (batch.prompt_logprob_targets == -1).all() and (batch.token_sources == -1).all()
    assert not np.shares_memory(empty_step_inputs(8, 2, 3).token_ids, batch.token_ids)  # a fresh array each step

    batch.positions = np.arange(8, dtype=np.int32)  # a field replaced by an array of its own
    repacked = pack_step_inputs(batch)
    assert repacked is not packed
    np.testing.assert_array_equal(repacked[8:16], np.arange(8))
    np.testing.assert_array_equal(repacked, np.concatenate([leaf.reshape(-1) for leaf in jax.tree.leaves(batch)]))

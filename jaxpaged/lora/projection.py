"""The batched low-rank product of one projection: every row adds its own adapter's x @ A.T @ B.T, all adapters in
one step, by two dense matmuls over the slots.

Why dense over slots rather than a gather of each row's A and B: the gather materialises a [rows, rank, in] copy
of A and a [rows, out, rank] copy of B per projection (at 64 decode rows and rank 16 that is more bytes than the
base weight itself), while the dense form reads each slot's A and B once and multiplies by the [rows, slots * rank]
shrunk activations with the other slots' columns zeroed. With a few slots (max_loras + 1) its extra FLOPs are
small against the base matmul, and XLA:CPU runs both as plain GEMMs (docs/lora.md has the measurement).
"""

import dataclasses
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True)
class LoRAProjection:
    """A projection weight as the matmuls take it (layers.matmuls), with the step's adapter slots beside it."""

    base: Any
    """The base weight in any form models/layers.matmul takes (float, packed, int8)."""
    a: Float[Array, "slots rank inner"]
    b: Float[Array, "slots outer rank"]
    """B with the adapter's scaling folded in; slot 0 (no adapter) is zeros."""
    row_slots: Float[Array, "tokens slots"]
    """One-hot of each token row's slot."""


def row_slot_one_hot(slots: Int[Array, " tokens"], num_slots: int, dtype) -> Float[Array, "tokens slots"]:
    """Each row's slot as a one-hot row (padding rows are slot 0, which adds nothing)."""
    return (slots[:, None] == jnp.arange(num_slots, dtype=slots.dtype)[None, :]).astype(dtype)


def lora_delta(x: Float[Array, "tokens inner"], projection: LoRAProjection) -> Float[Array, "tokens outer"]:
    """Each row's x @ A[slot].T @ B[slot].T, in float32."""
    a, b = projection.a.astype(x.dtype), projection.b.astype(x.dtype)
    shrunk = jnp.einsum("ti,sri->tsr", x, a, preferred_element_type=jnp.float32)
    # Rounded to the activation dtype between the two products, as PEFT's lora_B(lora_A(x)) rounds.
    shrunk = (shrunk * projection.row_slots[:, :, None].astype(jnp.float32)).astype(x.dtype)
    return jnp.einsum("tsr,sor->to", shrunk, b, preferred_element_type=jnp.float32)


def lora_delta_by_gather(x: Float[Array, "tokens inner"], projection: LoRAProjection,
                         slots: Int[Array, " tokens"]) -> Float[Array, "tokens outer"]:
    """lora_delta by gathering each row's A and B (the alternative measured against it; not used by the model)."""
    a, b = projection.a.astype(x.dtype)[slots], projection.b.astype(x.dtype)[slots]
    shrunk = jnp.einsum("ti,tri->tr", x, a, preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.einsum("tr,tor->to", shrunk, b, preferred_element_type=jnp.float32)


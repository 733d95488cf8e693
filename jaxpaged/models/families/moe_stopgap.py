"""STOPGAP until the `moe` branch's models/moe.py merges: routing, sort by expert, grouped matmuls
(jax.lax.ragged_dot), unsort and combine, for the Mixtral and gpt-oss families. Replaced by moe.py's functions."""

from collections.abc import Callable
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def route(logits: Float[Array, "tokens experts"], top_k: int, style: str,
          ) -> tuple[Int[Array, "tokens k"], Float[Array, "tokens k"]]:
    """(expert ids, weights) in float32: "softmax_topk_renorm" (Mixtral) or "topk_softmax" (gpt-oss)."""
    logits = logits.astype(jnp.float32)
    if style == "topk_softmax":
        values, ids = jax.lax.top_k(logits, top_k)
        return ids, jax.nn.softmax(values, axis=-1)
    values, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
    return ids, values / jnp.sum(values, axis=-1, keepdims=True)


def moe_mlp(x: Float[Array, "tokens hidden"], ids: Int[Array, "tokens k"], weights: Float[Array, "tokens k"],
            gate_up: Float[Array, "experts hidden two_inter"], down: Float[Array, "experts inter hidden"],
            activation: Callable, num_rows: Int[Array, ""], gate_up_bias: Optional[Array] = None,
            down_bias: Optional[Array] = None) -> Float[Array, "tokens hidden"]:
    """sum_k weight_k * down_e(activation(gate_up_e(x))) per token, experts run as grouped matmuls over the
    token-expert pairs sorted by expert; pairs of padding rows (num_rows on) sort past every group."""
    num_tokens, top_k = ids.shape
    num_experts = gate_up.shape[0]
    token_of_pair = jnp.arange(num_tokens * top_k, dtype=jnp.int32) // top_k
    expert_of_pair = jnp.where(token_of_pair < num_rows, ids.reshape(-1), num_experts)
    order = jnp.argsort(expert_of_pair, stable=True)
    sorted_tokens, sorted_experts = token_of_pair[order], expert_of_pair[order]
    group_sizes = jnp.bincount(expert_of_pair, length=num_experts + 1)[:num_experts].astype(jnp.int32)
    safe_experts = jnp.minimum(sorted_experts, num_experts - 1)
    h = jax.lax.ragged_dot(x[sorted_tokens], gate_up.astype(x.dtype), group_sizes,
                           preferred_element_type=jnp.float32)
    if gate_up_bias is not None:
        h = h + gate_up_bias[safe_experts].astype(jnp.float32)
    h = activation(h).astype(x.dtype)
    y = jax.lax.ragged_dot(h, down.astype(x.dtype), group_sizes, preferred_element_type=jnp.float32)
    if down_bias is not None:
        y = y + down_bias[safe_experts].astype(jnp.float32)
    y = y * weights.reshape(-1)[order][:, None] * (sorted_experts < num_experts)[:, None]
    return jnp.zeros((num_tokens, x.shape[1]), jnp.float32).at[sorted_tokens].add(y).astype(x.dtype)


def silu_gated(h: Float[Array, "rows two_inter"]) -> Float[Array, "rows inter"]:
    """silu(gate) * up of fused [gate | up] columns."""
    gate, up = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * up

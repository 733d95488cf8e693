"""bfloat16 held as its uint16 bits: how the engine keeps bfloat16 arrays that XLA:CPU would otherwise rewrite.

XLA:CPU has neither a bfloat16 scatter nor a bfloat16 dynamic-slice: for both it converts the whole operand to float32
and back. The KV pool (written every layer) and the stacked layer weights (sliced every layer) are therefore stored
as uint16 and bitcast at the point of use, which is free on every platform. Other dtypes pass through unchanged.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Shaped

BITS_DTYPE = jnp.dtype(jnp.uint16)
"""The storage dtype of bfloat16 bits; a uint16 array here always holds bfloat16 values."""


def to_bits(array: Shaped[Array, "*shape"]) -> Shaped[Array, "*shape"]:
    """A bfloat16 array as its uint16 bits; any other dtype unchanged."""
    return jax.lax.bitcast_convert_type(array, BITS_DTYPE) if array.dtype == jnp.bfloat16 else array


def from_bits(array: Shaped[Array, "*shape"]) -> Shaped[Array, "*shape"]:
    """The bfloat16 values of uint16 bits; any other dtype unchanged."""
    return jax.lax.bitcast_convert_type(array, jnp.bfloat16) if array.dtype == BITS_DTYPE else array

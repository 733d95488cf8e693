"""Pytree dataclasses shared by the kernels' metadata, the step inputs and the sampler's batch.

It lives outside the attention package because sampling and the runner use it too, and none of them
should import an attention kernel to declare a pytree.
"""

import dataclasses
from typing import TypeVar, Union

import jax
import numpy as np

HostOrDeviceArray = Union[jax.Array, np.ndarray]
"""An array of a pytree that is built on the host (numpy) and then put on the device (jax.Array; a tracer under
jit). Annotate such fields like `Int[HostOrDeviceArray, " num_tokens"]`: jaxtyping checks dtype and shape of both."""

_DataclassT = TypeVar("_DataclassT", bound=type)


def register_pytree_dataclass(cls: _DataclassT) -> _DataclassT:
    """`jax.tree_util.register_dataclass` (every field a child, same key paths), except that unflattening does
    not call `__init__`.

    JAX rebuilds a pytree from whatever leaves it holds at that moment: ArgInfo under `.lower()`,
    ShapeDtypeStruct, None, shardings. Skipping `__init__` (as equinox does) keeps a run-time type check of
    `__init__` (the jaxtyping hook the tests install) to the values the code itself passes.
    """
    names = tuple(field.name for field in dataclasses.fields(cls))
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in names)

    def flatten_with_keys(obj):
        return tuple((key, getattr(obj, name)) for key, name in zip(keys, names)), None

    def flatten(obj):
        return tuple(getattr(obj, name) for name in names), None

    def unflatten(_, children):
        obj = object.__new__(cls)
        for name, child in zip(names, children):
            object.__setattr__(obj, name, child)  # works on frozen dataclasses too
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls

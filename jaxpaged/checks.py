"""Small value checks shared by every layer that validates user input (host-only, no dependencies)."""

from typing import Any, TypeGuard, Union


def is_int(value: Any) -> TypeGuard[int]:
    """A real int: bool is a subclass of int, but True as a token count or a seed is almost surely a bug."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[Union[int, float]]:
    """An int or float that is not a bool (the same trap as is_int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)

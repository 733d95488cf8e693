"""Small value checks shared by every layer that validates user input (host-only, no dependencies)."""

import re
from typing import Any, TypeGuard, Union

_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def require(ok: bool, field: str, message: str) -> None:
    """ValueError "field: message" unless ok: every option check names the field it rejects."""
    if not ok:
        raise ValueError(f"{field}: {message}")


def is_int(value: Any) -> TypeGuard[int]:
    """A real int: bool is a subclass of int, but True as a token count or a seed is almost surely a bug."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[Union[int, float]]:
    """An int or float that is not a bool (the same trap as is_int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_byte_size(value: Any, field: str) -> int:
    """A byte count from an int or a string such as "8GiB", "512 MiB" or "1.5GB"; ValueError naming the field."""
    if is_int(value):
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if match and match.group(2).lower() in _BYTE_UNITS:
            return int(float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()])
    raise ValueError(f"{field}: must be a number of bytes, as an int or a string like '8GiB' or '512MB', "
                     f"got {value!r}")

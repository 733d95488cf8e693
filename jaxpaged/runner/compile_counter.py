"""Counts XLA compilations process-wide, through JAX's own monitoring events.

Every executable JAX builds (a fresh compile or a persistent-cache load) reports one backend-compile event,
so "no new event after warm-up" is the proof that serving never compiles.
"""

import threading

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_count = 0
_installed = False


def _on_event(event: str, duration_secs: float, **kwargs) -> None:
    global _count
    if event == _BACKEND_COMPILE_EVENT:
        with _lock:
            _count += 1


def install() -> None:
    """Start counting (idempotent)."""
    global _installed
    with _lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _installed = True


def num_compilations() -> int:
    """Compilations seen since install()."""
    return _count

"""jaxpaged: a JAX/TPU-first paged-attention LLM inference engine.

Public names are imported lazily so that host-only modules (jaxpaged.core) load without JAX.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "LLM": "jaxpaged.llm",
    "generate": "jaxpaged.llm",
    "LLMEngine": "jaxpaged.engine",
    "SamplingParams": "jaxpaged.sampling.params",
    "RequestOutput": "jaxpaged.outputs",
    "CompletionOutput": "jaxpaged.outputs",
    "RequestFailedError": "jaxpaged.outputs",
    "EngineConfig": "jaxpaged.config",
    "LoRARequest": "jaxpaged.lora.request",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'jaxpaged' has no attribute {name!r}")

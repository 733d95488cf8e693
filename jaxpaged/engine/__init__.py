"""The engine: a request's life from add_request to its last RequestOutput.

llm_engine.py: LLMEngine, whose step is schedule -> execute -> update; loops.py: the synchronous and the
overlapped (async scheduling) loop; requests.py + request_table.py: a request, its n samples and the table of
unfinished ones; output_processor.py: stops, text and logprobs -> outputs; ranks.py: data-parallel ranks;
step_timings.py: what observers see of each step. docs/architecture.md walks the path function by function.
"""

from jaxpaged.engine.llm_engine import LLMEngine, enable_persistent_compilation_cache
from jaxpaged.engine.loops import resolve_async_scheduling

__all__ = ["LLMEngine", "enable_persistent_compilation_cache", "resolve_async_scheduling"]

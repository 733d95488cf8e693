"""Parsers of what a model writes in its own syntax, picked by serve flags with vLLM's names: tool/ splits tool calls
from content (--tool-call-parser), reasoning.py splits `<think>` text from content (--reasoning-parser). Pure text
in, parts out, whole or as stream deltas: they know nothing of HTTP or the engine."""

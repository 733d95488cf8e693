"""Structured outputs: JSON schemas, regexes, choice lists and grammars as per-request token masks (llguidance)."""

from .grammar_compiler import CompiledGrammar, GrammarCompiler
from .request_grammar import RequestGrammar, fill_bitmasks, prefetch_bitmasks

__all__ = ["CompiledGrammar", "GrammarCompiler", "RequestGrammar", "fill_bitmasks", "prefetch_bitmasks"]

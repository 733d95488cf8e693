"""Speculative decoding on the embedded model: copy-heavy requests at several batch sizes, off against n-gram."""

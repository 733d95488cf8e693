"""One file per model family: its config reader, its checkpoint names and its registry entries (models/registry.py)."""

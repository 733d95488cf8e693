"""Hostile-client benchmarks (issue 56): what an attack costs the other clients of a live server."""

"""A bounded soak of `jaxpaged serve` on loopback: normal streams measured alone, then alongside hostile traffic
(slow readers, oversized and invalid bodies, too many prompts, wrong content types, disconnects); run with
`python -m benchmarks.soak` (issue 43)."""

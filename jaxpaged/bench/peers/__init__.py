"""Peers: other systems run on the same workload in the same run, so ratios are measured, not remembered.

Each peer returns the same metrics dict as jaxpaged's offline runner (throughput and latency); engine-only
figures (KV usage, compilations, host time per step) are absent. A peer that cannot run raises PeerUnavailable
(not installed) or PeerFailure (it ran and broke); the sweep records either as that peer's result.
"""


class PeerUnavailable(RuntimeError):
    """The peer's package or model format is not available here; the row says so instead of a figure."""


class PeerFailure(RuntimeError):
    """The peer ran and failed; the failure is its result."""

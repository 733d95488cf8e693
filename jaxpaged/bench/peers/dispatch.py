"""One entry point for every peer: load (once per run), warm up, run the repeats, take the medians."""

from typing import Optional

from jaxpaged.bench.bench_config import PeerConfig, SamplingConfig
from jaxpaged.bench.latency_stats import median_of_repeats
from jaxpaged.bench.workloads import BenchRequest


class PeerModels:
    """Peer models loaded at most once per run (loading the dequantized GGUF into torch takes a while)."""

    def __init__(self, model: Optional[str]):
        self.model = model
        self._hf: dict = {}
        self._llama_cpp: dict = {}

    def hf(self, dtype: str = "float32"):
        """The shared HF torch model in `dtype` (one per dtype; the other is dropped first, to bound memory)."""
        from jaxpaged.bench.peers.hf_model import HFPeerModel

        if dtype not in self._hf:
            self._hf.clear()
            self._hf[dtype] = HFPeerModel(self.model, dtype)
        return self._hf[dtype]

    def llama_cpp(self, options: dict):
        """A llama.cpp model per distinct option set."""
        from jaxpaged.bench.peers.llama_cpp import LlamaCppPeer

        key = tuple(sorted(options.items()))
        if key not in self._llama_cpp:
            self._llama_cpp[key] = LlamaCppPeer(self.model, options)
        return self._llama_cpp[key]


def measure_peer(peer: PeerConfig, models: PeerModels, requests: list[BenchRequest],
                 sampling: SamplingConfig) -> tuple[dict, list[dict]]:
    """(median metrics, per-repeat metrics) of `peer` on the workload; PeerUnavailable / PeerFailure propagate."""
    if peer.kind in ("hf_batched", "hf_continuous"):
        return _with_torch_threads(peer.options.get("num_threads"), _measure, peer, models, requests, sampling)
    return _measure(peer, models, requests, sampling)


def _with_torch_threads(num_threads: Optional[int], run, *args):
    """Run with torch's intra-op thread count set to num_threads (None: torch's default), then restore it."""
    import torch

    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return run(*args)
    finally:
        torch.set_num_threads(previous)


def _measure(peer: PeerConfig, models: PeerModels, requests: list[BenchRequest],
             sampling: SamplingConfig) -> tuple[dict, list[dict]]:
    if peer.kind == "hf_batched":
        from jaxpaged.bench.peers.hf_batched import run_hf_batched, warm_up_hf_batched

        hf = models.hf(peer.dtype)
        warm_up_hf_batched(hf, requests, sampling)
        repeats = [run_hf_batched(hf, requests, sampling, peer.batch_size) for _ in range(peer.repeats)]
    elif peer.kind == "hf_continuous":
        from jaxpaged.bench.peers.hf_continuous import run_hf_continuous, warm_up_hf_continuous

        hf = models.hf(peer.dtype)
        warm_up_hf_continuous(hf, requests, sampling)
        repeats = [run_hf_continuous(hf, requests, sampling) for _ in range(peer.repeats)]
    elif peer.kind == "llama_cpp":
        from jaxpaged.bench.peers.llama_cpp import run_llama_cpp

        llama = models.llama_cpp(peer.options)
        repeats = [run_llama_cpp(llama, requests, sampling) for _ in range(peer.repeats)]
    else:
        raise ValueError(f"peers[].kind: unknown peer {peer.kind!r}")
    return {**median_of_repeats(repeats), "dtype": peer.dtype}, repeats

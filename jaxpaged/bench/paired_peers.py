"""Peers that alternate with jaxpaged (vllm_cpu): loaded once per run, then their runs go between jaxpaged's, repeat
by repeat, on the same requests (jaxpaged, peer, jaxpaged, peer, ...), so a change of machine load reaches both
alike. Offline, the first runs' greedy tokens are compared position by position.

A peer alternates with the first jaxpaged point of each workload in its own dtype (online: the server's dtype
option, or any when it is left to "auto"); a workload no such point ran is measured alone afterwards (offline) or
reported unavailable (online).
"""

import pathlib
from collections.abc import Callable, Sequence
from typing import Any, Optional

from jaxpaged.bench.bench_config import BenchConfig, PeerConfig, SweepPoint
from jaxpaged.bench.latency_stats import median_of_repeats
from jaxpaged.bench.peers import PeerUnavailable
from jaxpaged.bench.peers.agreement import greedy_agreement
from jaxpaged.bench.workloads import BenchRequest

PAIRED_KINDS = ("vllm_cpu",)


def alternate(repeats: int, ours: Callable[[int], Any], theirs: Sequence[tuple[str, Callable[[int], Any]]]
              ) -> tuple[list, dict[str, list], dict[str, BaseException]]:
    """Repeat r runs ours(r), then every peer's run(r) in order: (our results, each peer's results, each failed
    peer's error). A peer that fails is left out of the later repeats; ours failing propagates."""
    our_results: list = []
    their_results: dict[str, list] = {name: [] for name, _ in theirs}
    failed: dict[str, BaseException] = {}
    for repeat in range(repeats):
        our_results.append(ours(repeat))
        for name, run in theirs:
            if name in failed:
                continue
            try:
                their_results[name].append(run(repeat))
            except Exception as error:  # the peer's failure is its result, not jaxpaged's
                failed[name] = error
    return our_results, their_results, failed


def peer_result(runs: list[tuple[dict, list[list[int]]]], reference: Optional[list[list[int]]]) -> tuple[dict, list]:
    """(median metrics with greedy agreement against `reference`, per-repeat metrics) of a peer's (metrics, tokens)
    runs; agreement compares the first run's tokens."""
    repeats = [metrics for metrics, _ in runs]
    metrics = median_of_repeats(repeats)
    if reference is not None:
        metrics.update(greedy_agreement(reference, runs[0][1]))
    return metrics, repeats


class PairedPeers:
    """The run's alternating peers: their loaded workers or servers, and their results per workload."""

    def __init__(self, config: BenchConfig, out_dir: pathlib.Path):
        self.model = config.model
        self.out_dir = out_dir
        self.peers = [peer for peer in config.peers if peer.kind in PAIRED_KINDS]
        self.results: dict[tuple[str, str], Any] = {}
        """(peer name, workload key) -> (metrics, repeats), or the error it met."""
        self._loaded: dict[str, Any] = {}
        """Peer name @ mode -> its worker or server, or the error starting it met (tried once)."""
        self._num_started = 0

    def close(self) -> None:
        """End every worker and server."""
        self.release(lambda peer: True)

    def release(self, done: Callable[[PeerConfig], bool]) -> None:
        """End the workers and servers of the peers `done` selects (a vLLM process holds gigabytes; one no later
        point needs goes at once). A released peer that is needed again is loaded again."""
        for key, loaded in list(self._loaded.items()):
            if not isinstance(loaded, Exception) and done(_peer(self.peers, key.rsplit("@", 1)[0])):
                del self._loaded[key]
                loaded.__exit__(None, None, None)

    def _model_dir(self) -> pathlib.Path:
        from jaxpaged.bench.peers.hf_export import hf_directory

        return hf_directory(self.model)

    def _load(self, peer: PeerConfig, online: bool):
        """The peer's loaded worker (offline) or healthy server (online); the error of its one start, raised."""
        key = f"{peer.name}@{'online' if online else 'offline'}"
        if key not in self._loaded:
            try:
                log = self.out_dir / f"{peer.kind}-{'server' if online else 'worker'}-{self._num_started}.log"
                self._num_started += 1
                if online:
                    from jaxpaged.bench.peers.vllm_server import VllmServer

                    self._loaded[key] = VllmServer(peer, self._model_dir(), log).__enter__()
                else:
                    from jaxpaged.bench.peers.vllm_cpu import VllmCpuPeer

                    self._loaded[key] = VllmCpuPeer(peer, self._model_dir(), log).__enter__()
            except Exception as error:
                self._loaded[key] = error
        loaded = self._loaded[key]
        if isinstance(loaded, Exception):
            raise loaded
        return loaded

    def _pending(self, key: str, dtype: Optional[str]) -> list[PeerConfig]:
        """Peers in `dtype` (None: any) with no result for workload `key` yet."""
        return [peer for peer in self.peers
                if (peer.name, key) not in self.results and (dtype is None or peer.dtype == dtype)]

    def run_offline(self, key: str, requests: list[BenchRequest], sampling, repeats: int, dtype: str,
                    run_ours: Callable[[Optional[list]], dict]) -> list[dict]:
        """jaxpaged's repeats (run_ours(tokens_out): one run, filling tokens_out with each request's output token
        ids when given) alternated with the pending peers' runs in `dtype`; our per-repeat metrics."""
        runners = []
        for peer in self._pending(key, dtype):
            try:
                worker = self._load(peer, online=False)
                worker.warm_up(requests, sampling)
                runners.append((peer.name, lambda _r, w=worker: w.run(requests, sampling)))
            except Exception as error:
                self.results[(peer.name, key)] = error
        our_tokens: list[list[int]] = []
        ours, theirs, failed = alternate(repeats, lambda r: run_ours(our_tokens if r == 0 else None), runners)
        for name, runs in theirs.items():
            try:
                self.results[(name, key)] = failed[name] if name in failed else peer_result(runs, our_tokens)
            except ValueError as error:  # outputs that cannot be compared are the peer row's error, not jaxpaged's
                self.results[(name, key)] = error
        return ours

    def run_online(self, key: str, requests: list[BenchRequest], point: SweepPoint,
                   run_ours: Callable[[int], dict], salt: str) -> list[dict]:
        """jaxpaged's server runs (run_ours(repeat)) alternated with the pending peers' servers in the point's dtype,
        every one driven by the same client on the same requests; our per-repeat metrics."""
        from jaxpaged.bench.online_runner import run_online_peer, warm_up_server
        from jaxpaged.bench.peers.vllm_server import SERVED_MODEL_NAME

        dtype = point.engine_options.get("dtype")
        runners = []
        for peer in self._pending(key, None if dtype in (None, "auto") else dtype):
            try:
                server = self._load(peer, online=True)
                warm_up_server(server, point.mode.warmup_requests, point.sampling, SERVED_MODEL_NAME)
                runners.append((peer.name, lambda r, s=server, n=peer.name: run_online_peer(
                    s, requests, point.sampling, point.mode, f"{salt}-{n}-{r}", SERVED_MODEL_NAME)))
            except Exception as error:
                self.results[(peer.name, key)] = error
        ours, theirs, failed = alternate(point.mode.repeats, run_ours, runners)
        for name, runs in theirs.items():
            self.results[(name, key)] = (failed[name] if name in failed
                                         else (median_of_repeats(runs) | {"dtype": _peer(self.peers, name).dtype},
                                               runs))
        return ours

    def result(self, peer: PeerConfig, point: SweepPoint, requests: list[BenchRequest], key: str) -> tuple[dict, list]:
        """The peer's (metrics, repeats) at this workload: as alternated, else measured alone now (offline); the
        error it met, raised."""
        found = self.results.get((peer.name, key))
        if found is None:
            if point.mode.kind == "online":
                raise PeerUnavailable(f"{peer.name}: no jaxpaged server in dtype {peer.dtype} ran this workload to "
                                      f"alternate with")
            worker = self._load(peer, online=False)
            worker.warm_up(requests, point.sampling)
            found = peer_result([worker.run(requests, point.sampling) for _ in range(peer.repeats)], None)
        if isinstance(found, BaseException):
            raise found
        return found


def _peer(peers: list[PeerConfig], name: str) -> PeerConfig:
    return next(peer for peer in peers if peer.name == name)

"""`python -m benchmarks.soak [--seconds 120]`: start `jaxpaged serve` (the embedded model unless --model), run
normal streams alone (the quiet run), then with hostile traffic alongside (the mixed run), and check the issue's
bounds: the normal streams' inter-token p99 within 2x of the quiet run's, the server's RSS bounded, no 5xx, and KV
usage back to 0 once the traffic stops. Prints the figures as JSON (and writes them to --out); exits 1 on a miss.
"""

import argparse
import asyncio
import pathlib
import platform
import sys
import tempfile
import threading
import time
from typing import Any, Optional

import numpy as np

from benchmarks.json_report import print_json
from benchmarks.soak.traffic import Tally, run_phase
from jaxpaged.bench.server_process import ServerProcess

DESCRIPTION = "A bounded soak of jaxpaged serve on loopback: normal streams alone, then with hostile traffic."
# Small enough to warm up in a minute on a laptop's CPU, large enough for the streams and the hostile requests.
SERVER_OPTIONS = dict(max_model_len=512, max_num_seqs=8, max_num_batched_tokens=256)
MAX_P99_RATIO = 2.0
DRAIN_TIMEOUT_S = 60.0


class RssSampler:
    """The peak resident set size of a process, sampled from /proc every `period_s` on a thread."""

    def __init__(self, pid: int, period_s: float = 0.5) -> None:
        self._pid, self._period_s = pid, period_s
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-rss", daemon=True)

    def now_mib(self) -> float:
        """The process's VmRSS now, in MiB."""
        for line in pathlib.Path(f"/proc/{self._pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for process {self._pid}")

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.peak_mib = max(self.peak_mib, self.now_mib())

    def __enter__(self) -> "RssSampler":
        self.peak_mib = self.now_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()


def p99_ms(tally: Tally) -> float:
    if not tally.inter_token_s:
        raise RuntimeError("the normal streams produced no inter-token gaps")
    return float(np.percentile(tally.inter_token_s, 99) * 1e3)


def drained_metrics(server: ServerProcess) -> dict[str, float]:
    """/metrics once nothing runs or waits (the hostile clients' requests aborted or finished)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        metrics = server.metrics()
        idle = metrics.get("jaxpaged_num_requests_running", 0) == 0 and metrics.get(
            "jaxpaged_num_requests_waiting", 0) == 0
        if idle or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def soak(seconds: float, quiet_seconds: float, num_normal: int, model: Optional[str], log_path: pathlib.Path,
         max_rss_growth_mib: float) -> dict[str, Any]:
    """Run the quiet and mixed phases against one server; the figures and which bounds held."""
    with ServerProcess(model, SERVER_OPTIONS, log_path) as server:
        sampler = RssSampler(server.pid)
        rss_start = sampler.now_mib()
        quiet = asyncio.run(run_phase(server.base_url, quiet_seconds, num_normal, hostile=False))
        rss_after_quiet = sampler.now_mib()
        with sampler:
            mixed = asyncio.run(run_phase(server.base_url, seconds, num_normal, hostile=True))
        metrics = drained_metrics(server)
        rss_after = sampler.now_mib()
    quiet_p99_ms, mixed_p99_ms = p99_ms(quiet), p99_ms(mixed)
    result: dict[str, Any] = dict(
        cpu=cpu_model(), seconds=seconds, quiet_seconds=quiet_seconds, num_normal_streams=num_normal,
        quiet_p99_ms=quiet_p99_ms, mixed_p99_ms=mixed_p99_ms, p99_ratio=mixed_p99_ms / quiet_p99_ms,
        quiet_p50_ms=float(np.percentile(quiet.inter_token_s, 50) * 1e3),
        mixed_p50_ms=float(np.percentile(mixed.inter_token_s, 50) * 1e3),
        quiet_streams=quiet.num_streams, mixed_streams=mixed.num_streams,
        statuses={str(status): count for status, count in sorted((quiet.statuses + mixed.statuses).items())},
        unexpected_statuses=dict(quiet.unexpected + mixed.unexpected),
        num_5xx=quiet.num_5xx + mixed.num_5xx,
        rss_mib=dict(start=rss_start, after_quiet=rss_after_quiet, peak_mixed=sampler.peak_mib, end=rss_after),
        kv_cache_usage_after=metrics.get("jaxpaged_kv_cache_usage_perc"),
        requests_running_after=metrics.get("jaxpaged_num_requests_running"))
    result["checks"] = dict(
        p99_within_2x=result["p99_ratio"] <= MAX_P99_RATIO,
        rss_bounded=sampler.peak_mib - rss_after_quiet <= max_rss_growth_mib,
        no_5xx=result["num_5xx"] == 0,
        expected_statuses=not result["unexpected_statuses"],
        kv_usage_back_to_0=result["kv_cache_usage_after"] == 0)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=DESCRIPTION)
    parser.add_argument("--seconds", type=float, default=120.0, help="the mixed run's length (default 120)")
    parser.add_argument("--quiet-seconds", type=float, default=None,
                        help="the quiet run's length (default: a quarter of --seconds, at least 10)")
    parser.add_argument("--normal-streams", type=int, default=2, help="concurrent normal streams (default 2)")
    parser.add_argument("--model", default=None, help="what `jaxpaged serve --model` takes (default: embedded)")
    parser.add_argument("--max-rss-growth-mib", type=float, default=256.0,
                        help="how far the server's RSS may rise above the quiet run's during the mixed run")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    quiet_seconds = args.quiet_seconds if args.quiet_seconds is not None else max(10.0, args.seconds / 4)
    log_path = (args.out.parent if args.out else pathlib.Path(tempfile.mkdtemp(prefix="soak-"))) / "server.log"
    result = soak(args.seconds, quiet_seconds, args.normal_streams, args.model, log_path, args.max_rss_growth_mib)
    print_json(result, args.out, indent=2)
    failed = [name for name, held in result["checks"].items() if not held]
    if failed:
        print(f"soak: FAILED {', '.join(failed)} (server log: {log_path})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

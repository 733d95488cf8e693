"""The bench sweep ships inside jaxpaged (jaxpaged/bench) but stays off the serving path: the engine, LLM and the
server import neither it nor the checkout's benchmarks/, and only `jaxpaged bench` reaches it, lazily."""

import json
import os
import pathlib
import subprocess
import sys

from jaxpaged.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _loaded_modules(code: str, tmp_path: pathlib.Path) -> list[str]:
    """Modules of benchmarks or jaxpaged.bench loaded after `code`, in a fresh process outside the checkout (this
    checkout's packages first on the path)."""
    probe = (f"{code}; import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == "
             "'benchmarks' or m == 'jaxpaged.bench' or m.startswith('jaxpaged.bench.'))))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_product_imports_load_no_bench_module(tmp_path):
    """Importing the package, LLM and the server app loads no sweep module and nothing of benchmarks/."""
    assert _loaded_modules("import jaxpaged, jaxpaged.llm, jaxpaged.server.app, jaxpaged.cli", tmp_path) == []


def test_cli_still_has_the_bench_command():
    parser = build_parser()
    args = parser.parse_args(["bench", "configs/bench/w1_offline.yaml", "--out", "/tmp/results"])
    assert args.command == "bench"
    assert (args.config, args.out) == ("configs/bench/w1_offline.yaml", "/tmp/results")
    assert args.handler.__name__ == "_bench"

"""The bench sweep lives in benchmarks/, outside the product: the engine, LLM and the server never import it, and
only `jaxpaged bench` reaches it, lazily."""

import json
import subprocess
import sys

from jaxpaged.cli import build_parser


def test_product_imports_load_no_benchmarks_module(tmp_path):
    """A fresh process (outside the checkout, so only the installed mapping could find `benchmarks`)."""
    code = ("import json, sys; import jaxpaged, jaxpaged.llm, jaxpaged.server.app; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'benchmarks' or m.startswith('benchmarks.'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_cli_still_has_the_bench_command():
    parser = build_parser()
    args = parser.parse_args(["bench", "configs/bench/w1_offline.yaml", "--out", "/tmp/results"])
    assert args.command == "bench"
    assert (args.config, args.out) == ("configs/bench/w1_offline.yaml", "/tmp/results")
    assert args.handler.__name__ == "_bench"


def test_bench_finds_the_sweep_from_any_directory(tmp_path):
    """The editable install maps `benchmarks`, so the console script's lazy import works outside the checkout."""
    code = "import benchmarks.sweep.sweep as sweep; print(callable(sweep.bench_main))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "True"

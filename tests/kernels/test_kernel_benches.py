"""The one-shot GPU and TPU kernel benches run end to end in --smoke (interpret mode, tiny sizes) and pass: a lease
of an accelerator is too short to find a broken script on it. Slow (minutes of interpret mode): `make test-slow`."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("script, sections", [("gpu_kernel_bench.py", ["correctness", "decode", "prefill"]),
                                              ("tpu_kernel_bench.py", ["correctness", "decode", "prefill"])])
def test_a_kernel_bench_runs_every_section_in_smoke_mode_and_passes(tmp_path, script, sections):
    out = tmp_path / "report.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "kernels" / script), "--smoke", "--out", str(out),
               "--sections", *sections]
    result = subprocess.run(command, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert sorted(report["sections"]) == sorted(sections) and report["failures"] == []
    rows = report["sections"]["correctness"]["rows"]
    assert rows and all(row["max_abs_check"] == "PASS" for row in rows)
    assert all(isinstance(row.get("interleaved_us", row.get("ours_us")), float)
               for row in report["sections"]["decode"]["rows"])

"""Peak host memory of one load, measured in a fresh interpreter: libraries are imported and the high-water mark
reset before the baseline, so only the load itself is counted (Linux /proc)."""

import json
import pathlib
import subprocess
import sys
from typing import Any

_SCRIPT = """
import json, pathlib, sys
import jax, ml_dtypes, numpy
{imports}

def status_kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM to the current RSS
before = status_kib("VmRSS")
{load}
growth_bytes = (status_kib("VmHWM") - before) * 1024
print(json.dumps({{"growth_bytes": growth_bytes, **({report})}}))
"""


def measure_load_peak(imports: str, load: str, report: str, path: pathlib.Path) -> dict[str, Any]:
    """Run `load` (a statement reading sys.argv[1], which is `path`) after `imports`, and return the JSON of
    `report` (a dict expression over what `load` bound) plus growth_bytes: how far the peak RSS rose above the
    baseline."""
    script = _SCRIPT.format(imports=imports, load=load, report=report)
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])

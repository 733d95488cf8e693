"""The wheel: its top-level packages are exactly jaxpaged and pallas_kernels (benchmarks/ stays in the checkout), it
carries the sweep runner, the kernels and the native kernels' C++ sources, and `jaxpaged bench` runs from it alone."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What the build reads: the packages setuptools may find, and the files pyproject.toml names.
SOURCES = ("jaxpaged", "pallas_kernels", "benchmarks", "tests", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """A wheel built from a copy of the checkout (so no build/ left in the tree can leak into it), offline."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                             "-q", "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (built,) = out.glob("jaxpaged-*.whl")
    return built


def top_level_packages(names: list[str]) -> set[str]:
    """First path components of a wheel's entries, its .dist-info metadata left out."""
    return {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}


def test_the_wheel_installs_jaxpaged_and_pallas_kernels_only(wheel):
    """No top-level benchmarks (nor tests): the one-off studies stay outside the wheel."""
    names = zipfile.ZipFile(wheel).namelist()
    assert top_level_packages(names) == {"jaxpaged", "pallas_kernels"}


def test_the_wheel_carries_the_sweep_the_kernels_and_the_native_sources(wheel):
    """`jaxpaged bench`'s runner, the Pallas kernels and the C++ sources compiled on first use are all inside."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("jaxpaged/cli.py", "jaxpaged/bench/sweep.py", "jaxpaged/bench/peers/dispatch.py",
                   "pallas_kernels/ragged_paged_attention/tpu.py", "pallas_kernels/ragged_paged_attention/gpu.py",
                   "jaxpaged/kernels/attention_dispatch.py", "jaxpaged/kernels/cpu_native/paged_decode.cc",
                   "jaxpaged/kernels/cpu_native/packed_tiles.h"):
        assert needed in names, needed


def test_top_level_packages_ignores_the_metadata():
    """The helper reads a package from each entry's first component and skips .dist-info."""
    names = ["a/__init__.py", "a/b/c.py", "z.dist-info/METADATA", "p/x.py"]
    assert top_level_packages(names) == {"a", "p"}


def test_jaxpaged_bench_runs_from_the_unpacked_wheel(wheel, tmp_path):
    """Outside any checkout, with only the wheel's files on the path: `jaxpaged bench` reaches the sweep's config
    check (a clear error naming the unknown section), and no `benchmarks` package is importable."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # a pure-python wheel's install is its files on the path
    config = tmp_path / "bad.yaml"
    config.write_text("name: smoke\nbogus_section: 1\n")
    # PathFinder searches sys.path only (the wheel's files, site-packages), not an editable install's mapping.
    code = ("import importlib.machinery, sys; from jaxpaged.cli import main; import jaxpaged.bench; "
            "print(jaxpaged.bench.__file__); print(importlib.machinery.PathFinder.find_spec('benchmarks')); "
            f"sys.exit(main(['bench', {str(config)!r}]))")
    # PYTHONPATH puts the wheel's files ahead of any editable install's finder (a meta-path hook after the path).
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    bench_file, benchmarks_spec = result.stdout.strip().splitlines()[-2:]
    assert pathlib.Path(bench_file).is_relative_to(site)
    assert benchmarks_spec == "None"
    assert "jaxpaged bench: error: bogus_section: unknown section" in result.stderr

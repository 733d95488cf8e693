"""pyproject.toml holds compatible ranges and constraints.txt the exact versions behind them: every runtime
dependency and every extra's package has a pin that satisfies its range, nothing at run time is `==`-pinned, and
neither torch nor a test tool is a runtime dependency (`pip install jaxpaged` serves on a CPU)."""

import pathlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SELF = canonicalize_name(PROJECT["name"])
TEST_TOOLS = ("torch", "pytest", "pytest-xdist", "hypothesis", "accelerate", "ruff", "pyright", "beartype")


def constraint_pins(text: str) -> dict[str, Version]:
    """constraints.txt's `name==version` lines by canonical name; ValueError for anything but an exact pin."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        if requirement.extras or len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
            raise ValueError(f"constraints.txt: {line!r} is not an exact `name==version` pin")
        name = canonicalize_name(requirement.name)
        if name in pins:
            raise ValueError(f"constraints.txt: {requirement.name} is pinned twice")
        pins[name] = Version(specifiers[0].version)
    return pins


PINS = constraint_pins((ROOT / "constraints.txt").read_text())


def requirements(group: str) -> list[Requirement]:
    """One dependency group's requirements: "runtime" or an extra's name; the project's own extras are left out."""
    texts = PROJECT["dependencies"] if group == "runtime" else PROJECT["optional-dependencies"][group]
    return [req for req in map(Requirement, texts) if canonicalize_name(req.name) != SELF]


GROUPS = ["runtime", *PROJECT["optional-dependencies"]]


def test_runtime_dependencies_are_ranges_not_pins():
    for requirement in requirements("runtime"):
        operators = {spec.operator for spec in requirement.specifier}
        assert operators, f"{requirement}: give a compatible range (>=X,<Y), pinned in constraints.txt"
        assert not operators & {"==", "==="}, f"{requirement}: an exact pin belongs in constraints.txt"
        assert "<" in operators, f"{requirement}: give an upper bound, so a new major release cannot break installs"


def test_runtime_has_no_torch_and_no_test_tools():
    names = {canonicalize_name(req.name) for req in requirements("runtime")}
    assert not names & {canonicalize_name(tool) for tool in TEST_TOOLS}


@pytest.mark.parametrize("group", GROUPS)
def test_every_requirement_has_a_pin_inside_its_range(group):
    for requirement in requirements(group):
        name = canonicalize_name(requirement.name)
        assert name in PINS, f"[{group}] {requirement}: no exact pin in constraints.txt"
        assert requirement.specifier.contains(PINS[name]), \
            f"[{group}] {requirement}: constraints.txt pins {PINS[name]}, outside the range"


def test_extras_are_the_documented_ones():
    extras = PROJECT["optional-dependencies"]
    assert set(extras) == {"tpu", "cuda", "test", "bench", "dev"}
    assert [Requirement(text).extras for text in extras["tpu"]] == [{"tpu"}]
    assert [Requirement(text).extras for text in extras["cuda"]] == [{"cuda12"}]
    dev_self = [Requirement(text) for text in extras["dev"] if canonicalize_name(Requirement(text).name) == SELF]
    assert [req.extras for req in dev_self] == [{"test", "bench"}]


def test_accelerator_extras_bring_their_pinned_runtimes():
    """jax[tpu] pulls libtpu and jax[cuda12] the CUDA plugin: those pins keep a TPU or GPU install reproducible."""
    assert {"libtpu", "jax-cuda12-plugin", "jax-cuda12-pjrt"} <= set(PINS)
    assert PINS["jax-cuda12-plugin"] == PINS["jax-cuda12-pjrt"] == PINS["jax"] == PINS["jaxlib"]


def test_pin_parser_rejects_anything_but_exact_pins():
    assert constraint_pins("# comment\nfoo==1.2  # why\n\nBar_Baz==3") == {"foo": Version("1.2"),
                                                                            "bar-baz": Version("3")}
    for bad in ("foo>=1", "foo", "foo[x]==1", "foo==1.*", "foo==1\nFOO==2"):
        with pytest.raises(ValueError):
            constraint_pins(bad)


def test_every_makefile_install_goes_through_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PIP_INSTALL = -m pip install -q -c \$\(CONSTRAINTS\)$", makefile, re.M)
    assert re.search(r"^CONSTRAINTS := constraints\.txt$", makefile, re.M)
    installs = [line.strip() for line in makefile.splitlines() if "pip install" in line or "PIP_INSTALL)" in line]
    # The bench-only vLLM environment (make peer-vllm) is not the project's: its requirements file pins its own
    # versions (vLLM brings its own torch), and nothing of it reaches .venv.
    project_installs = [line for line in installs
                        if not line.startswith("PIP_INSTALL =") and "--upgrade pip" not in line
                        and not line.startswith("$(VLLM_VENV)/")]
    assert project_installs and all("$(PIP_INSTALL)" in line for line in project_installs), project_installs
    tpu_packages = re.search(r"^TPU_PACKAGES := (.+)$", makefile, re.M)
    assert tpu_packages is not None
    for package in tpu_packages.group(1).replace("'", "").split():
        if package == "-e":  # the project itself, editable: its extra's requirements are what must be pinned
            continue
        if package.startswith(".["):
            for extra in package[2:-1].split(","):
                for requirement in PROJECT["optional-dependencies"][extra]:
                    assert canonicalize_name(Requirement(requirement).name) in PINS, requirement
            continue
        assert canonicalize_name(Requirement(package).name) in PINS, package
    default_model = re.search(r"^DEFAULT_MODEL_PKG := (\S+)$", makefile, re.M)
    assert default_model is not None and canonicalize_name(default_model.group(1)) in PINS

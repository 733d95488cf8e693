"""jaxpaged/core stays plain Python: no jax (nor numpy), so it runs anywhere and costs little per step."""

import ast
import pathlib

import jaxpaged.core

FORBIDDEN_TOP_LEVEL_PACKAGES = {"jax", "jaxlib", "flax", "numpy", "torch"}


def imported_packages(path: pathlib.Path) -> set[str]:
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            packages.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            assert node.module is not None  # only relative imports have no module
            packages.add(node.module.split(".")[0])
    return packages


def test_core_modules_import_no_array_library():
    core_dir = pathlib.Path(jaxpaged.core.__file__).parent
    sources = sorted(core_dir.glob("*.py"))
    assert len(sources) >= 8
    offenders = {path.name: imported_packages(path) & FORBIDDEN_TOP_LEVEL_PACKAGES for path in sources}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_core_imports_only_itself_the_config_and_checks_from_jaxpaged():
    core_dir = pathlib.Path(jaxpaged.core.__file__).parent
    for path in core_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0:
                module = node.module
                assert module is not None  # only relative imports have no module
            else:  # relative: one dot is jaxpaged.core, two dots jaxpaged
                package = "jaxpaged.core" if node.level == 1 else "jaxpaged"
                module = package + (f".{node.module}" if node.module else "")
            if module.startswith("jaxpaged"):
                allowed = module.startswith("jaxpaged.core") or module in ("jaxpaged.config", "jaxpaged.checks")
                assert allowed, (path.name, module)

"""The floor plan holds: docs/architecture.md names functions that exist, and the rooms import only what the
plan allows (engine without the server, runner internals or optional features; sampling without the runner)."""

import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"`((?:jaxpaged|benchmarks)/[\w/]+\.py):([\w.]+)`")
OPTIONAL_FEATURES = ("jaxpaged.features.kv_tiers", "jaxpaged.features.multihost", "jaxpaged.features.prefix_advisor",
                     "jaxpaged.kv_tiers", "jaxpaged.multihost", "jaxpaged.core.prefix_advisor")


def doc_entries() -> list[tuple[str, str]]:
    return ENTRY.findall((ROOT / "docs" / "architecture.md").read_text())


def test_the_lifecycle_doc_lists_the_whole_path():
    """Enough entries to cover server -> engine -> scheduler -> runner -> sampler -> outputs."""
    files = {path for path, _ in doc_entries()}
    assert len(doc_entries()) >= 40
    for room in ("server/", "engine/", "core/", "runner/", "models/", "sampling/", "features/"):
        assert any(room in path for path in files), room


@pytest.mark.parametrize(("path", "qualified_name"), doc_entries())
def test_every_function_the_lifecycle_doc_names_exists(path: str, qualified_name: str):
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    target = module
    for part in qualified_name.split("."):
        target = getattr(target, part)
    assert callable(target), f"{path}:{qualified_name} is not a function or class"


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only: never imported at run time)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            inside.update(id(child) for statement in node.body for child in ast.walk(statement))
    return inside


def imports_of(path: pathlib.Path) -> set[str]:
    """Absolute module names a file imports at run time."""
    found = set()
    tree = ast.parse(path.read_text())
    annotations_only = _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def sources(room: str) -> list[pathlib.Path]:
    paths = sorted((ROOT / room).rglob("*.py"))
    assert paths, room
    return paths


def test_the_engine_imports_no_server_no_runner_internals_and_no_optional_feature():
    for path in sources("jaxpaged/engine"):
        for module in imports_of(path):
            assert not module.startswith("jaxpaged.server"), (path.name, module)
            assert not module.startswith("jaxpaged.runner.") or module in ("jaxpaged.runner.ModelRunner",
                                                                            "jaxpaged.runner.ForwardedStep",
                                                                            "jaxpaged.runner.LockStepRanks",
                                                                            "jaxpaged.runner.build_rank_runners",
                                                                            "jaxpaged.runner.compile_counter"), \
                (path.name, module)
            assert not module.startswith(OPTIONAL_FEATURES), (path.name, module)


def test_sampling_imports_nothing_from_the_runner_the_server_or_the_attention_kernels():
    for path in sources("jaxpaged/sampling"):
        for module in imports_of(path):
            assert not module.startswith(("jaxpaged.runner", "jaxpaged.server", "jaxpaged.engine",
                                          "pallas_kernels.ragged_paged_attention")), (path.name, module)


def test_optional_features_are_imported_only_where_they_are_wired():
    """Inside the product, the feature adapters are imported by features/wiring.py alone (the feature packages
    themselves, the server's multi-host start-up and the advise command use their own rooms)."""
    for path in sources("jaxpaged"):
        relative = path.relative_to(ROOT).as_posix()
        if relative == "jaxpaged/features/wiring.py":
            continue
        for module in imports_of(path):
            if module.startswith(("jaxpaged.features.kv_tiers", "jaxpaged.features.multihost",
                                  "jaxpaged.features.prefix_advisor")):
                pytest.fail(f"{relative} imports {module}")


def test_the_kernels_import_nothing_of_the_engine():
    for path in sources("jaxpaged/kernels"):
        for module in imports_of(path):
            if module.startswith("jaxpaged"):
                assert module.startswith("jaxpaged.kernels"), (path.name, module)

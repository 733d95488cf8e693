"""The import graph of jaxpaged and pallas_kernels, read from the source (every import statement, at module level or
inside a function): it has no cycle, and pallas_kernels imports nothing of jaxpaged."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jaxpaged", "pallas_kernels")


def module_files(root: pathlib.Path, packages: tuple[str, ...]) -> dict[str, pathlib.Path]:
    """{dotted module name: file} of every .py under the packages (a package is its __init__)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _known_module(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The longest prefix of `name` that is one of `modules` (`from pkg import name` names a module or an attribute)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Absolute dotted names an import statement names (relative imports resolved against `module`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            anchor = anchor.rpartition(".")[0]
        base = f"{anchor}.{base}" if base else anchor
    return [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: pathlib.Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """{module: the modules of `packages` it imports}, from every import statement anywhere in its file (functions,
    methods, `if TYPE_CHECKING:` blocks included: an import moved into a function still closes a cycle)."""
    modules = module_files(root, packages)
    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported_names(node, module, path.name == "__init__.py"):
                    # `from pkg import name`: the submodule pkg.name when it is one, else pkg itself.
                    target = _known_module(name, modules)
                    if target is not None:
                        targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import cycle is in one."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(start: str) -> None:
        # Iterative Tarjan: (node, its successors left to try).
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = lowlink[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in index:
                    index[successor] = lowlink[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                elif successor in on_stack:
                    lowlink[node] = min(lowlink[node], index[successor])
                continue
            work.pop()
            if work:
                lowlink[work[-1][0]] = min(lowlink[work[-1][0]], lowlink[node])
            if lowlink[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_jaxpaged_and_pallas_kernels_have_no_import_cycle():
    """No two modules import each other, directly or around a loop, counting imports inside functions."""
    assert cycles(import_graph(ROOT)) == []


def test_pallas_kernels_import_nothing_of_jaxpaged():
    """The kernels package stands alone: no module of it imports jaxpaged, at module level or in a function."""
    graph = import_graph(ROOT)
    kernels = {module: targets for module, targets in graph.items() if module.startswith("pallas_kernels")}
    assert len(kernels) >= 15
    assert {(module, target) for module, targets in kernels.items() for target in targets
            if target.split(".")[0] == "jaxpaged"} == set()


def test_the_graph_holds_imports_made_inside_functions():
    """The backend switch imports the Mosaic kernel inside a function; the graph has that edge, and the module-level
    ones beside it."""
    graph = import_graph(ROOT)
    assert "pallas_kernels.ragged_paged_attention.tpu" in graph["jaxpaged.kernels.attention_dispatch"]
    assert "jaxpaged.kernels.xla_attention" in graph["jaxpaged.kernels.attention_dispatch"]
    assert "pallas_kernels.ragged_paged_attention.metadata" in graph["jaxpaged.models.layers"]


def test_the_wheels_packages_import_nothing_of_benchmarks():
    """benchmarks/ is not in the wheel: no module of jaxpaged (the sweep runner in jaxpaged/bench included) or
    pallas_kernels imports it, even inside a function."""
    graph = import_graph(ROOT, PACKAGES + ("benchmarks",))
    assert any("jaxpaged.bench.machine_info" in targets for module, targets in graph.items()
               if module.startswith("benchmarks."))  # the one-off studies reuse the sweep's helpers
    assert {(module, target) for module, targets in graph.items() if not module.startswith("benchmarks")
            for target in targets if target.split(".")[0] == "benchmarks"} == set()


def _write_package(root: pathlib.Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    """a imports b at module level, b imports a inside a function: one cycle {a, b}; c, imported by both, is not in
    it."""
    _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import helper\nfrom pkg import c\n",
        "pkg/b.py": "import pkg.c\n\ndef helper():\n    from pkg.a import helper as again\n    return again\n",
        "pkg/c.py": "X = 1\n",
    })
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b", "pkg.c"}
    assert graph["pkg.b"] == {"pkg.a", "pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_relative_imports_and_a_longer_loop_are_found(tmp_path):
    """x -> y -> z -> x through relative imports (`from . import`, `from .z import`) is one cycle of three."""
    _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/x.py": "from . import y\n",
        "pkg/sub/y.py": "from .z import VALUE\n",
        "pkg/sub/z.py": "VALUE = 1\n\ndef f():\n    from ..sub import x\n    return x\n",
        "pkg/leaf.py": "from pkg.sub import x\n",
    })
    assert cycles(import_graph(tmp_path, ("pkg",))) == [["pkg.sub.x", "pkg.sub.y", "pkg.sub.z"]]

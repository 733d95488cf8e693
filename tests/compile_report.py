"""Where the suite's time goes to XLA: a pytest plugin, on when JAXPAGED_TEST_COMPILE_REPORT=1 (tests/conftest.py).

Sums jax.monitoring's duration events per test and per file: the backend compile (XLA's compile, or its load from
the persistent compilation cache: the event covers both), jaxpr tracing and lowering to MLIR; counts persistent-cache
hits and misses (a miss is a program compiled from scratch), the engines each file builds (ModelRunner) and warms up,
and the distinct programs in the session's cache at the end. Prints the top files and tests by CPU time after the run
(under xdist the workers send theirs to the controller). Off by default: it costs nothing then.
"""

import collections
import dataclasses
import os
import pathlib
import resource
import time
from typing import Any, Optional

import pytest

ENV_VAR = "JAXPAGED_TEST_COMPILE_REPORT"
_TOP_FILES = 30
_TOP_TESTS = 15

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_CACHE_RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_CACHE_MISS = "/jax/compilation_cache/cache_misses"


@dataclasses.dataclass
class CompileTotals:
    """One test's (or file's) share of compile work, in seconds and counts."""

    wall: float = 0.0
    cpu: float = 0.0
    """This process's CPU seconds (all threads) and its finished children's: robust where wall time is not, on a
    loaded machine."""
    backend: float = 0.0
    trace: float = 0.0
    lower: float = 0.0
    retrieval: float = 0.0
    compiles: int = 0
    hits: int = 0
    misses: int = 0
    engines: int = 0
    warmups: int = 0

    def add(self, other: "CompileTotals") -> None:
        """Adds other's figures to these."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class CompileReport:
    """The plugin: listeners on jax.monitoring, per-test totals, the summary at the end."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.current = "<collection>"
        self.per_test: dict[str, CompileTotals] = collections.defaultdict(CompileTotals)
        self._install()

    def _install(self) -> None:
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(self._on_duration)
        monitoring.register_event_listener(self._on_event)
        from jaxpaged.runner import model_runner

        report = self
        runner_init, runner_warmup = model_runner.ModelRunner.__init__, model_runner.ModelRunner.warmup

        def counted_init(runner, *args: Any, **kwargs: Any) -> None:
            report.per_test[report.current].engines += 1
            runner_init(runner, *args, **kwargs)

        def counted_warmup(runner, *args: Any, **kwargs: Any) -> float:
            report.per_test[report.current].warmups += 1
            return runner_warmup(runner, *args, **kwargs)

        model_runner.ModelRunner.__init__ = counted_init  # type: ignore[method-assign]
        model_runner.ModelRunner.warmup = counted_warmup  # type: ignore[method-assign]

    def _on_duration(self, event: str, duration_secs: float, **_: Any) -> None:
        totals = self.per_test[self.current]
        if event == _BACKEND_COMPILE:
            totals.backend += duration_secs
            totals.compiles += 1
        elif event == _TRACE:
            totals.trace += duration_secs
        elif event == _LOWER:
            totals.lower += duration_secs
        elif event == _CACHE_RETRIEVAL:
            totals.retrieval += duration_secs

    def _on_event(self, event: str, **_: Any) -> None:
        if event == _CACHE_HIT:
            self.per_test[self.current].hits += 1
        elif event == _CACHE_MISS:
            self.per_test[self.current].misses += 1

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Optional[pytest.Item]):
        """Attributes the events of the test's setup, call and teardown to it (a module fixture to its first)."""
        self.current = item.nodeid.split("@", 1)[0]  # the xdist group suffix off
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        yield
        self.per_test[self.current].wall += time.perf_counter() - start
        self.per_test[self.current].cpu += _cpu_seconds() - cpu_start
        self.current = "<between tests>"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """An xdist worker sends its figures to the controller."""
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["compile_report"] = {name: dataclasses.asdict(t) for name, t in self.per_test.items()}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """The controller adds a worker's figures to its own."""
        for name, figures in getattr(node, "workeroutput", {}).get("compile_report", {}).items():
            self.per_test[name].add(CompileTotals(**figures))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The top files and tests by compile time, the suite's totals and the distinct programs cached."""
        if getattr(self.config, "workeroutput", None) is not None:
            return
        per_file: dict[str, CompileTotals] = collections.defaultdict(CompileTotals)
        total = CompileTotals()
        for name, totals in self.per_test.items():
            per_file[_file_of(name)].add(totals)
            total.add(totals)
        write = terminalreporter.write_line
        terminalreporter.section("XLA compile report (JAXPAGED_TEST_COMPILE_REPORT)")
        write("cpu = CPU seconds of this process and its children; compile = backend compile or cache load "
              "(summed over threads: warm-up compiles side by side);")
        write("trace/lower = jaxpr tracing and MLIR lowering; miss = compiled from scratch; eng/warm = ModelRunners "
              "built / warmed up")
        header = (f"{'wall s':>8} {'cpu s':>8} {'compile':>8} {'trace':>7} {'lower':>7} {'progs':>6} {'miss':>5} "
                  f"{'hit':>5} {'eng':>4} {'warm':>4}  ")
        write(header + "file")
        for name, totals in sorted(per_file.items(), key=lambda kv: -kv[1].cpu)[:_TOP_FILES]:
            write(_row(totals) + name)
        write(_row(total) + "TOTAL")
        write("")
        write(header + "test")
        for name, totals in sorted(self.per_test.items(), key=lambda kv: -kv[1].cpu)[:_TOP_TESTS]:
            write(_row(totals) + name)
        cache_dir = os.environ.get("JAXPAGED_TESTS_XLA_CACHE")
        if cache_dir and pathlib.Path(cache_dir).is_dir():
            programs = sum(1 for path in pathlib.Path(cache_dir).iterdir() if path.name.endswith("-cache"))
            write(f"distinct programs in the session's XLA cache: {programs}")


def _row(totals: CompileTotals) -> str:
    return (f"{totals.wall:8.1f} {totals.cpu:8.1f} {totals.backend:8.1f} {totals.trace:7.1f} {totals.lower:7.1f} "
            f"{totals.compiles:6d} {totals.misses:5d} {totals.hits:5d} {totals.engines:4d} {totals.warmups:4d}  ")


def register_if_asked(config: pytest.Config) -> None:
    """Registers the plugin when JAXPAGED_TEST_COMPILE_REPORT=1."""
    if os.environ.get(ENV_VAR, "") not in ("", "0"):
        config.pluginmanager.register(CompileReport(config), "jaxpaged_compile_report")

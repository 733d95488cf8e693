"""Fixtures shared across test folders: a tiny random-weight model that uses the real SmolLM2 tokenizer.

Also turns on run-time jaxtyping checks (shapes, dtypes, dim names consistent within one call) for the model, runner
and kernel code: the import hook decorates every function and dataclass of those packages with
`@jaxtyped(typechecker=beartype)`. It must be installed before any of them is imported, so it sits at the top of the
root conftest, which pytest imports (after the empty `tests/__init__.py`) before any test module. Jitted functions are
checked when they are traced.
"""

import contextlib
import logging
import os
import pathlib
import shutil
import sys
import tempfile
from typing import Any

import jaxtyping
import pytest

from tests import compile_report
from tests.lazy_compile import engines_compile_on_first_use

# The sampling modules that were runner/ before the redesign: SamplingParams (sampling.params) is left out, as it
# validates user input itself (a ValueError naming the field, not a type-check error).
_TYPE_CHECKED_PACKAGES = ("pallas_kernels", "jaxpaged.models", "jaxpaged.runner", "jaxpaged.kernels",
                          "jaxpaged.sampling.sampler", "jaxpaged.sampling.batch", "jaxpaged.sampling.token_sampler",
                          "jaxpaged.sampling.bitmask", "jaxpaged.sampling.prompt_logprobs",
                          "jaxpaged.sampling.step_result")
_already_imported = sorted(name for name in sys.modules
                           if any(name == p or name.startswith(p + ".") for p in _TYPE_CHECKED_PACKAGES))
if _already_imported:  # the hook only instruments modules imported after it is installed
    raise RuntimeError(f"jaxtyping run-time checks cannot cover modules imported before tests/conftest.py: "
                       f"{_already_imported}")
jaxtyping.install_import_hook(list(_TYPE_CHECKED_PACKAGES), "beartype.beartype")

TINY_LLAMA: dict[str, Any] = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=True,
    bos_token_id=1, eos_token_id=2)

# Small engine limits for tests: few buckets (fast compiles), small pool.
TINY_ENGINE_OPTIONS: dict[str, Any] = dict(
    max_model_len=256, max_num_seqs=16, max_num_batched_tokens=64, num_kv_blocks=48, dtype="float32",
    attention_backend="xla", compilation_cache_dir="")


_SESSION_XLA_CACHE = "JAXPAGED_TESTS_XLA_CACHE"
"""Environment variable naming the test session's XLA compilation cache (set by the process that starts pytest)."""
_CACHE_OWNER = pytest.StashKey[str]()


def pytest_configure(config) -> None:
    """One XLA compilation cache for the whole test session: the xdist workers and every server, cluster and
    worker process the tests spawn (they inherit the environment). Many tests build an engine of the same tiny
    model and options, and every process compiles them again; with the cache the second one loads instead
    (~15% of the suite's time on 2 cores). A fresh directory per session, removed at its end: a run never
    depends on what an earlier run, or another checkout, left behind. Engines built with compilation_cache_dir=""
    use it; a test that passes its own directory still gets its own.
    """
    # torch (the HF references) on one thread, in this process, the xdist workers and the children (set before any of
    # them imports torch): with two, on a machine the other worker keeps busy, the second thread spins while it waits
    # (tests/models/test_qwen3_moe.py + test_text_towers.py 30.1 -> 24.2 s of CPU). A value already set is kept.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    path = os.environ.get(_SESSION_XLA_CACHE)
    if path is None:  # the controller (or a run without xdist): it owns the directory
        path = tempfile.mkdtemp(prefix="jaxpaged-tests-xla-")
        os.environ[_SESSION_XLA_CACHE] = path
        config.stash[_CACHE_OWNER] = path
    settings = {"jax_compilation_cache_dir": path, "jax_persistent_cache_min_compile_time_secs": 0.0,
                "jax_persistent_cache_min_entry_size_bytes": 0}
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)  # read by JAX in the processes the tests start
    import jax

    for name, value in settings.items():
        jax.config.update(name, value)  # this process has imported JAX already (jaxtyping does)
    engines_compile_on_first_use()  # tests/lazy_compile.py: only the programs a test runs are compiled
    compile_report.register_if_asked(config)


def pytest_unconfigure(config) -> None:
    path = config.stash.get(_CACHE_OWNER, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _jaxpaged_logger_kept():
    logger = logging.getLogger("jaxpaged")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.fixture(autouse=True)
def _jaxpaged_logger_as_found():
    """A test that runs the command line in-process (jaxpaged.cli.main) configures the "jaxpaged" logger for a
    console (its own handler on the test's stderr, no propagation); later tests' caplog needs it as it was."""
    with _jaxpaged_logger_kept():
        yield


@pytest.fixture(autouse=True, scope="module")
def _jaxpaged_logger_as_found_by_the_module():
    """The same for module fixtures that run the command line (the bench sweep's)."""
    with _jaxpaged_logger_kept():
        yield


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir() -> pathlib.Path:
    """HF tokenizer files of the embedded model (converted from its GGUF once, then cached)."""
    from jaxpaged.weights.loader import locate_model

    return locate_model(None)[0]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer_dir) -> pathlib.Path:
    """A seeded random 2-layer Llama with SmolLM2's vocabulary, saved as an HF checkpoint with its tokenizer."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smollm2_tokenizer_dir, TINY_LLAMA)


def save_tiny_llama(directory: pathlib.Path, tokenizer_dir: pathlib.Path, config: dict[str, Any],
                    config_class: str = "LlamaConfig") -> pathlib.Path:
    """A seeded random model of `config` (a Llama unless config_class names another transformers config) saved as
    an HF checkpoint beside a copy of the tokenizer files."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config))
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, directory / name)
    return directory


# Fixtures that cost nothing to build twice (they do not make a module worth keeping on one worker).
_CHEAP_SHARED_FIXTURES = frozenset({"_jaxpaged_logger_as_found_by_the_module", "tmp_path_factory", "pytestconfig",
                                    "worker_id", "testrun_uid"})


def _shared_fixture_defs(item) -> list:
    """The fixture definitions above function scope that the test uses (engines, servers, wheels, references)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [defs[-1] for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope != "function" and name not in _CHEAP_SHARED_FIXTURES]


def modules_kept_on_one_worker(items) -> set[str]:
    """Test files whose tests share a fixture no other file uses: a module- or class-scoped one, or a session one
    that only this file's tests request (a session fixture of several files is built once per worker anyway)."""
    files_of_fixture: dict[int, set[str]] = {}
    scope_of_fixture: dict[int, str] = {}
    for item in items:
        for fixture_def in _shared_fixture_defs(item):
            files_of_fixture.setdefault(id(fixture_def), set()).add(item.nodeid.split("::", 1)[0])
            scope_of_fixture[id(fixture_def)] = fixture_def.scope
    return {file for key, files in files_of_fixture.items()
            if scope_of_fixture[key] != "session" or len(files) == 1 for file in files}


def _xdist_group_names(item, modules_on_one_worker: set[str]) -> list[str]:
    """The item's xdist_group names; a module kept on one worker (modules_kept_on_one_worker) is its own group."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    module = item.nodeid.split("::", 1)[0]
    if not names and module in modules_on_one_worker:
        names = [f"module-{module}"]
    return names


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Makes `--dist loadgroup` keep each xdist_group on one worker under pytest 9 too, and keeps each module whose
    tests share a module-scoped fixture on one worker.

    pytest-xdist 3.8 tags grouped tests by assigning `item._nodeid`, which pytest 9 no longer reads (the id
    lives in `item._id`), so the groups were spread over both workers and each built its own engine. Ungrouped
    tests are dealt out one by one, so a module's tests landed on both workers and each worker built the module's
    engine, server, wheel or HF reference again (for the hostile suite, a second server process per file).
    """
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers under --dist loadgroup
        return
    from _pytest.nodeid import coerce_node_id

    modules_on_one_worker = modules_kept_on_one_worker(items)
    for item in items:
        names = _xdist_group_names(item, modules_on_one_worker)
        suffix = "@" + "_".join(names)
        if not names or item.nodeid.endswith(suffix):
            continue
        item._id = coerce_node_id(item.nodeid + suffix)


def hf_greedy_continuations(model, tokenizer, prompts: list[str], num_new_tokens: int) -> list[list[int]]:
    """HF transformers' greedy generate of exactly num_new_tokens per prompt (EOS held off by min_new_tokens)."""
    import torch

    continuations = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer.encode(prompt)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=num_new_tokens, min_new_tokens=num_new_tokens, do_sample=False)
        continuations.append(out[0, ids.shape[1]:].tolist())
    return continuations

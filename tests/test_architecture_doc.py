"""docs/architecture.md is the request's real path: a chat completion on a tiny model, traced from engine start-up
to the last SSE chunk, calls every function the document's numbered steps name.

The document's existence check (tests/test_architecture.py) cannot see a function that still exists but is no longer
called; this one can. Start-up is traced too, because the model and the sampler run as compiled programs whose
Python is only called while they are traced, at warm-up.
"""

import pathlib
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import TINY_ENGINE_OPTIONS
from tests.lazy_compile import warmed_up_as_served

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
ENTRY = re.compile(r"`((?:jaxpaged|pallas_kernels)/[\w/]+\.py:[\w.]+)`(†?)")
"""A `file:function` entry, and its † when it is a branch only some requests take (not traced)."""
STEP = re.compile(r"^\d+\. ", re.MULTILINE)
PATH_SECTIONS = ("## 1.", "## 2.", "## 3.", "## 4.", "## Start-up")


def path_steps() -> list[list[list[str]]]:
    """The numbered steps of the request's path (and the start-up line), each a list of alternatives ("...; or ...");
    an alternative is the entries it names (branches marked † left out), all of which must be called."""
    text = DOC.read_text()
    steps = []
    for section in text.split("\n## ")[1:]:
        if not any(("## " + section).startswith(name) for name in PATH_SECTIONS):
            continue
        body = section.split("\n", 1)[1]
        chunks = STEP.split(body)[1:] if STEP.search(body) else [body]
        for chunk in chunks:
            alternatives = [[entry for entry, branch in ENTRY.findall(part) if not branch]
                            for part in re.split(r";\s+or\b", chunk)]
            if any(alternatives):  # a step of branches only is not on the plain request's path
                steps.append([entries for entries in alternatives if entries])
    return steps


class CallTrace:
    """Every Python function called in any thread while active, as "path relative to the repo:qualified name"."""

    def __init__(self) -> None:
        self.calls: set[str] = set()
        self._root = str(ROOT) + "/"

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            filename = frame.f_code.co_filename
            if filename.startswith(self._root):
                self.calls.add(f"{filename[len(self._root):]}:{frame.f_code.co_qualname}")

    def __enter__(self) -> "CallTrace":
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


@pytest.fixture(scope="module")
def traced_chat(tiny_model_dir) -> Iterator[set[str]]:
    """The calls of: start an engine and a server on the tiny model, stream one chat completion, shut down."""
    import jax

    from jaxpaged.async_engine import AsyncLLMEngine
    from jaxpaged.engine import LLMEngine
    from jaxpaged.server import ServerSettings, build_app
    from tests.server.server_helpers import ServerThread

    # jit traces a function once per process and shape: a step traced by an earlier test of this worker would not
    # run its Python again. Cleared, start-up traces every compiled function anew.
    jax.clear_caches()
    with CallTrace() as trace, warmed_up_as_served():  # the documented path starts with the serving warm-up
        engine = AsyncLLMEngine(LLMEngine.from_options(str(tiny_model_dir), **TINY_ENGINE_OPTIONS))
        engine.start()
        try:
            with ServerThread(build_app(engine, ServerSettings())) as server:
                body = {"model": engine.model_name, "messages": [{"role": "user", "content": "Say hello."}],
                        "max_tokens": 4, "temperature": 0, "stream": True}
                with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as reply:
                    lines = [line for line in reply.iter_lines() if line]
                assert reply.status_code == 200
                assert lines[-1] == "data: [DONE]"
        finally:
            engine.shutdown()
    yield trace.calls


def test_the_doc_names_a_path():
    """The parser finds the numbered path (at least 40 steps), so an empty parse cannot pass the next test."""
    assert len(path_steps()) >= 40


@pytest.mark.parametrize("step", path_steps(), ids=lambda step: step[0][0].split(":")[1])
def test_each_step_the_doc_names_is_called_by_a_real_chat_completion(step, traced_chat):
    """Every function of the step (or of one of its alternatives) ran during the traced request."""
    missing = [[entry for entry in alternative if entry not in traced_chat] for alternative in step]
    assert any(not entries for entries in missing), f"not on the request's path: {missing}"

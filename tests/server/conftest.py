"""A real jaxpaged server for the server tests: the embedded SmolLM2-135M behind uvicorn on 127.0.0.1.

One engine, compiled once per session, serves several apps on their own ports: a plain one, one that needs
an API key, and one that queues nothing (max_queued_requests=0). Every test must leave the engine idle.
"""

from collections.abc import Iterator

import httpx
import openai
import pytest

from jaxpaged.async_engine import AsyncLLMEngine
from jaxpaged.server import ServerSettings, build_app
from tests.lazy_compile import warmed_up_as_served
from tests.server.server_helpers import API_KEY, SERVER_ENGINE_OPTIONS, ServerThread, wait_until_idle


@pytest.fixture(scope="session")
def async_engine() -> Iterator[AsyncLLMEngine]:
    """The embedded model's engine on its loop thread (start-up compiles every bucket, once)."""
    from jaxpaged.engine import LLMEngine

    with warmed_up_as_served():  # as a server does; test_metrics counts compiles
        engine = AsyncLLMEngine(LLMEngine.from_options(None, **SERVER_ENGINE_OPTIONS))
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def server(async_engine) -> Iterator[ServerThread]:
    """The plain server: no key, default limits."""
    with ServerThread(build_app(async_engine, ServerSettings())) as running:
        yield running


@pytest.fixture(scope="session")
def auth_server(async_engine) -> Iterator[ServerThread]:
    """A server that needs API_KEY."""
    with ServerThread(build_app(async_engine, ServerSettings(api_key=API_KEY))) as running:
        yield running


@pytest.fixture(scope="session")
def overload_server(async_engine) -> Iterator[ServerThread]:
    """A server that lets no sequence wait for an engine slot."""
    with ServerThread(build_app(async_engine, ServerSettings(max_queued_requests=0))) as running:
        yield running


@pytest.fixture(scope="session")
def hermes_server(async_engine) -> Iterator[ServerThread]:
    """A server started with --tool-call-parser hermes (tool_choice "auto" works)."""
    with ServerThread(build_app(async_engine, ServerSettings(tool_call_parser="hermes"))) as running:
        yield running


@pytest.fixture(scope="session")
def details_server(async_engine) -> Iterator[ServerThread]:
    """A server started with --enable-prompt-tokens-details (usage shows cached_tokens)."""
    with ServerThread(build_app(async_engine, ServerSettings(enable_prompt_tokens_details=True))) as running:
        yield running


@pytest.fixture(autouse=True)
def engine_left_idle(request) -> Iterator[None]:
    """After each test that used the engine: every request finished or aborted, every KV block released."""
    yield
    if "async_engine" in request.fixturenames:
        wait_until_idle(request.getfixturevalue("async_engine"))


@pytest.fixture
def model_name(async_engine) -> str:
    """The id /v1/models reports."""
    return async_engine.model_name


@pytest.fixture
def client(server) -> openai.OpenAI:
    """The official OpenAI client pointed at the plain server (no retries, so a 429 shows)."""
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def http(server) -> Iterator[httpx.Client]:
    """httpx on the plain server."""
    with httpx.Client(base_url=server.base_url, timeout=120) as session:
        yield session

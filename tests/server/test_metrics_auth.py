"""/metrics behind a key: its prefix-cache counters are an oracle of other clients' prompts, so with --api-key it
needs the API key, with --metrics-key that key alone, and it is open only with --metrics-open."""

import httpx
import pytest

from jaxpaged.server import ServerSettings, build_app
from jaxpaged.server.http.auth import BearerAuthMiddleware
from jaxpaged.server.serve_flags import settings_from_args
from tests.server.server_helpers import API_KEY, ServerThread

pytestmark = pytest.mark.xdist_group("server")

METRICS_KEY = "scrape-token-8b31c0"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _statuses(base_url: str, *headers: dict[str, str]) -> list[int]:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        return [client.get("/metrics", headers=each).status_code for each in headers]


def test_api_key_guards_metrics(auth_server):
    """With --api-key alone, /metrics answers 401 (OpenAI body, no key echoed) without it and 200 with it."""
    with httpx.Client(base_url=auth_server.base_url, timeout=30) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["type"] == "authentication_error" and "/metrics" in refused.text
        assert client.get("/metrics", headers=_bearer("wrong")).status_code == 401
        served = client.get("/metrics", headers=_bearer(API_KEY))
        assert served.status_code == 200 and "vllm:prefix_cache_hits" in served.text


def test_metrics_key_alone_opens_metrics(async_engine):
    """With --metrics-key, /metrics takes that key and not the API key (tenants share it); the API routes still
    take the API key and not the metrics key."""
    settings = ServerSettings(api_key=API_KEY, metrics_key=METRICS_KEY)
    with ServerThread(build_app(async_engine, settings)) as running:
        assert _statuses(running.base_url, {}, _bearer(API_KEY), _bearer(METRICS_KEY)) == [401, 401, 200]
        with httpx.Client(base_url=running.base_url, timeout=30) as client:
            assert client.get("/v1/models", headers=_bearer(METRICS_KEY)).status_code == 401
            assert client.get("/v1/models", headers=_bearer(API_KEY)).status_code == 200
            assert client.get("/health").status_code == 200


def test_metrics_key_without_api_key_guards_only_metrics(async_engine):
    """A metrics key on a keyless server guards /metrics and leaves the API open."""
    with ServerThread(build_app(async_engine, ServerSettings(metrics_key=METRICS_KEY))) as running:
        assert _statuses(running.base_url, {}, _bearer(METRICS_KEY)) == [401, 200]
        assert httpx.get(running.base_url + "/v1/models", timeout=30).status_code == 200


def test_metrics_open_is_an_explicit_opt_in(async_engine):
    """--metrics-open serves /metrics to anyone while the API still needs the key."""
    with ServerThread(build_app(async_engine, ServerSettings(api_key=API_KEY, metrics_open=True))) as running:
        assert _statuses(running.base_url, {}) == [200]
        assert httpx.get(running.base_url + "/v1/models", timeout=30).status_code == 401


def test_keyless_server_keeps_metrics_open(server):
    """Without any key every route is open (nothing to protect it with), /metrics included."""
    assert _statuses(server.base_url, {}) == [200]


def test_flags_and_environment_make_the_settings(monkeypatch, caplog):
    """--metrics-key (or $JAXPAGED_METRICS_KEY) and --metrics-open reach ServerSettings (the latter with a warning
    beside an API key); both at once is refused naming the flag; the repr hides the metrics key."""
    from jaxpaged.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve", "--api-key", API_KEY, "--metrics-key", METRICS_KEY])
    settings = settings_from_args(args)
    assert (settings.api_key, settings.metrics_key, settings.metrics_open) == (API_KEY, METRICS_KEY, False)
    assert METRICS_KEY not in repr(settings) and API_KEY not in repr(settings)
    monkeypatch.setenv("JAXPAGED_METRICS_KEY", "from-env")
    assert settings_from_args(parser.parse_args(["serve"])).metrics_key == "from-env"
    monkeypatch.delenv("JAXPAGED_METRICS_KEY")
    assert settings_from_args(parser.parse_args(["serve", "--metrics-open"])).metrics_open is True
    assert "--metrics-open" not in caplog.text  # no key: nothing is opened that was closed
    assert settings_from_args(parser.parse_args(["serve", "--api-key", API_KEY, "--metrics-open"])).metrics_open
    assert "--metrics-open: /metrics answers without a key" in caplog.text and API_KEY not in caplog.text
    with pytest.raises(ValueError, match="^metrics_open: "):
        settings_from_args(parser.parse_args(["serve", "--metrics-open", "--metrics-key", METRICS_KEY]))
    with pytest.raises(ValueError, match="^metrics_key: "):
        ServerSettings(metrics_key="")


def test_middleware_picks_the_key_by_path():
    """The check per path: probes open, /metrics the metrics key, API routes the API key (hand-worked table)."""
    middleware = BearerAuthMiddleware(app=None, api_key=API_KEY, metrics_key=METRICS_KEY)  # pyright: ignore[reportArgumentType]
    table = [("/health", b"", True), ("/version", b"", True), ("/metrics", b"", False),
             ("/metrics", f"Bearer {METRICS_KEY}".encode(), True), ("/metrics", f"Bearer {API_KEY}".encode(), False),
             ("/metrics/", f"Bearer {METRICS_KEY}".encode(), False), ("/v1/models", f"Bearer {API_KEY}".encode(), True),
             ("/v1/models", f"Bearer {METRICS_KEY}".encode(), False)]
    assert [middleware.is_authorized(header, path) for path, header, _ in table] == [ok for _, _, ok in table]

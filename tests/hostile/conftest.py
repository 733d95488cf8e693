"""The hostile-client suite: issue 56's attacks, each against a live server, each followed by a normal request.

The grammar, sampling, secure and stream attack files share one live server (`hostile_server`: the union of the
flags they need; xdist group "hostile" keeps them on one worker), started once per session instead of once per file
(a `python -m jaxpaged.server` start and its warm-up cost ~8 s of CPU each). Every attack still ends by checking that
the server answers the normal request as before it. The KV-events file starts a server of its own (it publishes
events over CURVE). All of them share the session's XLA cache, so only the first one compiles.
"""

from collections.abc import Iterator

import pytest

from jaxpaged.sampling.grammar.worker_protocol import CRASH_ON_ENV
from tests.hostile.live_server import CRASH_REGEX, LiveServer


@pytest.fixture(scope="session")
def hostile_server(tiny_model_dir, tmp_path_factory) -> Iterator[LiveServer]:
    """One keyed live server for the attack files: tool_choice "auto" reads hermes calls, room for an output of
    1,000 brackets (--max-model-len 1024), and the grammar worker's crash hook armed for CRASH_REGEX only."""
    log = tmp_path_factory.mktemp("hostile-server") / "server.log"
    with LiveServer(tiny_model_dir, log, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                    "--max-model-len", "1024", env={CRASH_ON_ENV: CRASH_REGEX}) as running:
        yield running

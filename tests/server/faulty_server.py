"""`python -m tests.server.faulty_server [serve flags]`: `python -m jaxpaged.server` whose engine step raises on
every call, the fault the fail-stop test injects (warm-up runs no step, so the server starts and serves /health)."""

import sys

from jaxpaged.engine import LLMEngine
from jaxpaged.server.__main__ import main


def _failing_step(self: LLMEngine) -> list:
    raise RuntimeError("simulated device failure")


if __name__ == "__main__":
    LLMEngine.step = _failing_step  # type: ignore[method-assign]
    sys.exit(main())

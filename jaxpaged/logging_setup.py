"""Console logging for the command line: jaxpaged's own lines (the start-up plan, the dtype choice, the KV tiers'
choices) on stderr at the chosen level, so a server that takes minutes to start says what it is doing."""

import logging
import sys

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
_HANDLER_NAME = "jaxpaged-console"


def configure_logging(level: str = "info") -> None:
    """Send the "jaxpaged" loggers' records at `level` and above to stderr. Idempotent: a second call only changes
    the level and the stream (today's sys.stderr). For the command line, which owns the process: records stop at
    this handler, since the root logger may hold a stderr handler too (absl's logging, imported through orbax,
    calls basicConfig) and would print each line twice."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log_level: must be one of {LOG_LEVELS}, got {level!r}")
    logger = logging.getLogger("jaxpaged")
    logger.setLevel(level.upper())
    logger.propagate = False
    for old in [handler for handler in logger.handlers if handler.get_name() == _HANDLER_NAME]:
        # Replaced, not re-pointed: its stream may be a stderr a caller has since closed (flushing it would fail).
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)

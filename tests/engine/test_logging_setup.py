"""The command line's console logging: jaxpaged's INFO lines reach stderr at the default level, once per record
(tests/conftest.py puts the logger back as it was after each test)."""

import logging

import pytest

from jaxpaged.logging_setup import configure_logging


def test_info_lines_reach_stderr_once_however_often_it_is_configured(capsys):
    """Once: the root logger's own stderr handler (absl adds one at import) does not print them again."""
    root = logging.getLogger()
    root_handlers = list(root.handlers)
    root.addHandler(logging.StreamHandler())  # what absl's import-time basicConfig leaves on the root logger
    try:
        configure_logging("info")
        configure_logging("info")
        logging.getLogger("jaxpaged.runner.startup").info("start-up plan: devices [0]")
        logging.getLogger("jaxpaged.runner.startup").debug("not at info")
    finally:
        root.handlers[:] = root_handlers
    err = capsys.readouterr().err
    assert err.count("start-up plan: devices [0]") == 1
    assert "INFO jaxpaged.runner.startup: start-up plan: devices [0]" in err
    assert "not at info" not in err


def test_the_level_can_be_raised_and_a_bad_one_is_named(capsys):
    configure_logging("info")  # configured before (say by an earlier command in this process), then raised
    configure_logging("warning")
    logging.getLogger("jaxpaged.engine").info("quiet")
    logging.getLogger("jaxpaged.engine").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "WARNING jaxpaged.engine: loud" in err
    with pytest.raises(ValueError, match="^log_level: must be one of"):
        configure_logging("verbose")

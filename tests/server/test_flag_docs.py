"""The serve flags, the request keys and their documentation cannot drift apart: docs/vllm-compatibility.md's flag and
key tables are the rows in jaxpaged/server/vllm/compat_*_rows.py rendered, each row's status agrees with the parser
and the request validator, every test the page cites exists, and every flag `jaxpaged serve` takes is documented
(docs/server.md, docs/vllm-compatibility.md, docs/configuration.md or the engine options page)."""

import argparse
import ast
import functools
import re
from pathlib import Path

from jaxpaged.server.compat_checks import (
    flag_row_problems,
    key_row_problems,
    registry_problems,
    serve_parser,
    untested_rows,
)
from jaxpaged.server.parsers.reasoning import REASONING_PARSERS
from jaxpaged.server.parsers.tool import TOOL_CALL_PARSERS
from jaxpaged.server.vllm.compat_docs import PAGE, render_page, stale_page_message
from jaxpaged.server.vllm.compat_flag_rows import VLLM_FLAG_ROWS
from jaxpaged.server.vllm.compat_rows import FlagRow, KeyRow

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
_FLAG = re.compile(r"`(--?[a-zA-Z][a-zA-Z0-9-]*)")
_CITATION = re.compile(r"`(?P<file>(?:tests/[\w/]+/)?test_\w+\.py|tests/[\w/]+/)?(?:::(?P<test>test_\w+))?`")


def test_every_serve_flag_is_documented():
    """A flag added to `jaxpaged serve` without a line in the docs fails here."""
    documented = set()
    for page in DOCS.glob("*.md"):
        documented |= set(_FLAG.findall(page.read_text()))
    # A BooleanOptionalAction's --no-X is documented with its --X; an argparse.SUPPRESSed flag is a vLLM flag
    # that the compatibility table covers by name or as "any other vLLM flag".
    missing = sorted(flag for flag, action in serve_parser()._option_string_actions.items()
                     if flag.startswith("--") and flag != "--help" and action.help != argparse.SUPPRESS
                     and flag not in documented and flag.replace("--no-", "--", 1) not in documented)
    assert not missing, f"serve flags without documentation: {missing}"


def test_the_page_s_tables_are_the_rows_rendered():
    """A row edited without regenerating the page (or a table edited by hand) fails here."""
    text = PAGE.read_text()
    generated = render_page(text)
    assert generated == text, stale_page_message(text, generated)


def test_every_row_s_status_agrees_with_the_code():
    """No row contradicts the serve parser or the request validator (compat_checks.py lists what is held)."""
    assert registry_problems() == []


def test_a_status_that_contradicts_the_parser_is_named():
    """A refused flag marked supported, a real flag marked no-op or not yet, and a flag in two rows are each
    reported by name."""
    rows = (FlagRow(status="supported", flags=("-pp",)), FlagRow(status="accepted no-op", flags=("--max-num-seqs",)),
            FlagRow(status="not yet", flags=("--seed",)), FlagRow(status="supported", flags=("--seed",)),
            FlagRow(status="not yet", flags=("--swap-space",)))
    problems = "\n".join(flag_row_problems(rows))
    for expected in ("-pp: 'supported', but the serve parser refuses it", "--max-num-seqs: 'accepted no-op'",
                     "--seed: 'not yet'", "--seed: in two rows", "--swap-space: 'not yet'",
                     "--enforce-eager: a warned no-op without an 'accepted no-op' row",
                     "--cpu-offload-gb: refused by the parser without a 'not yet' row"):
        assert expected in problems


def test_a_status_that_contradicts_the_request_validator_is_named():
    """A key the validator takes marked "not yet", a refused key marked supported, a key no schema reads, and a
    refused key without a row are each reported by name, per endpoint."""
    rows = (KeyRow(status="not yet", keys=("temperature",)), KeyRow(status="supported", keys=("use_beam_search",)),
            KeyRow(status="supported", keys=("chat:no_such_key",)), KeyRow(status="supported", keys=("chat:echo",)))
    problems = "\n".join(key_row_problems(rows))
    for expected in ("chat temperature: 'not yet'", "completions temperature: 'not yet'",
                     "chat use_beam_search: 'supported', but request_keys.py refuses it",
                     "chat no_such_key: 'supported', but the request schema does not read it",
                     "chat echo: 'supported', but request_keys.py refuses it",
                     "completions prompt_embeds: refused by request_keys.py without a 'not yet' row"):
        assert expected in problems


def test_a_row_without_a_test_is_named():
    """A row that cites no test, in its tests or inline in its note, is reported; one citing a test is not."""
    rows = (FlagRow(status="supported", flags=("--seed",), note="a seed"),
            FlagRow(status="supported", flags=("--port",), note="(`test_serve_flags.py`)"),
            KeyRow(status="supported", keys=("seed",), tests=("test_request_keys.py",)))
    assert untested_rows(rows) == ["`--seed`: cites no test"]


def test_the_parser_rows_name_every_parser():
    """The --tool-call-parser and --reasoning-parser rows name every parser the server has."""
    notes = {flag: row.notes_cell() for row in VLLM_FLAG_ROWS for flag in row.flags}
    assert [name for name in TOOL_CALL_PARSERS if f"`{name}`" not in notes["--tool-call-parser"]] == []
    assert [name for name in REASONING_PARSERS if f"`{name}`" not in notes["--reasoning-parser"]] == []


def test_the_server_page_s_parser_table_names_every_tool_parser():
    """docs/server.md's table of tool-call formats has a row for every --tool-call-parser name."""
    text = (DOCS / "server.md").read_text()
    table = text[text.index("| parser | models | the model writes |"):].split("\n\n")[0]
    named = {name for line in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", line.split(" | ")[0])}
    assert sorted(set(TOOL_CALL_PARSERS) - named) == []


@functools.cache
def _test_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _missing_citations(text: str) -> list[str]:
    """Each `file.py::test` the text cites (`::test` after a file on the same line) that does not exist."""
    missing = []
    for line in text.splitlines():
        cited_file = None
        for match in _CITATION.finditer(line):
            if match.group("file"):
                cited_file = match.group("file")
                path = ROOT / cited_file if cited_file.startswith("tests/") else ROOT / "tests" / "server" / cited_file
                if not path.exists():
                    missing.append(cited_file)
                    continue
            test = match.group("test")
            if test is None:
                continue
            path = ROOT / cited_file if cited_file and cited_file.startswith("tests/") else \
                ROOT / "tests" / "server" / (cited_file or "")
            if cited_file is None or not path.is_file() or test not in _test_names(path):
                missing.append(f"{cited_file}::{test}")
    return missing


def test_every_cited_test_exists():
    """A test renamed or removed while the compatibility page still cites it fails here."""
    assert _missing_citations(PAGE.read_text()) == []


def test_a_missing_citation_is_found():
    """The citation check reports an unknown file, an unknown test, and a `::test` with no file before it."""
    text = ("| `test_no_such_file.py` | `test_flag_docs.py::test_no_such_test`, `::test_every_cited_test_exists` |\n"
            "| `::test_every_cited_test_exists` |")
    assert _missing_citations(text) == ["test_no_such_file.py", "test_flag_docs.py::test_no_such_test",
                                        "None::test_every_cited_test_exists"]


_NAMED_FLAG = re.compile(r"`(--[a-zA-Z][a-zA-Z0-9-]*[a-zA-Z0-9]|-[a-zA-Z]{1,2})(?![\w-])")
_OTHER_TOOLS_FLAGS = {"--max-client-batch-size", "-H"}
"""Other tools' flags the pages name: TGI's (for comparison) and curl's."""


def test_the_server_and_configuration_pages_name_only_flags_that_exist():
    """A flag renamed or removed in the code while docs/server.md or docs/configuration.md still names it fails here
    (a "not yet" row's flag counts: the pages may say it is refused)."""
    from jaxpaged.cli import build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    known = {flag for command in commands.choices.values() for flag in command._option_string_actions}
    known |= {flag for row in VLLM_FLAG_ROWS if row.status == "not yet" for flag in row.flags}
    unknown = {f"{page}: {flag}" for page in ("server.md", "configuration.md")
               for flag in _NAMED_FLAG.findall((DOCS / page).read_text())
               if flag not in known | _OTHER_TOOLS_FLAGS and flag.replace("--no-", "--", 1) not in known}
    assert sorted(unknown) == []

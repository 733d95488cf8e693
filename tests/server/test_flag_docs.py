"""The serve flags and their documentation cannot drift apart: every flag `jaxpaged serve` takes is documented
(docs/server.md, docs/vllm-compatibility.md, docs/configuration.md or the engine options page), and every flag
docs/vllm-compatibility.md marks supported or different is one `jaxpaged serve` takes, while a "not yet" flag is
refused or unknown."""

import argparse
import re
from pathlib import Path

from jaxpaged.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"
_FLAG = re.compile(r"`(--?[a-zA-Z][a-zA-Z0-9-]*)")


def _serve_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices["serve"]


def _serve_flags() -> dict[str, argparse.Action]:
    return {option: action for action in _serve_parser()._actions for option in action.option_strings}


def _compatibility_rows() -> list[tuple[set[str], str]]:
    """(the flags a row names, its status) for each row of docs/vllm-compatibility.md's tables."""
    rows = []
    for line in (DOCS / "vllm-compatibility.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) >= 4 and cells[2] in ("supported", "different", "not yet", "accepted"):
            rows.append((set(_FLAG.findall(cells[1])), cells[2]))
    return rows


def test_every_serve_flag_is_documented():
    """A flag added to `jaxpaged serve` without a line in the docs fails here."""
    documented = set()
    for page in DOCS.glob("*.md"):
        documented |= set(_FLAG.findall(page.read_text()))
    # A BooleanOptionalAction's --no-X is documented with its --X; an argparse.SUPPRESSed flag is a vLLM flag
    # that the compatibility table covers by name or as "any other vLLM flag".
    missing = sorted(flag for flag, action in _serve_flags().items()
                     if flag.startswith("--") and flag != "--help" and action.help != argparse.SUPPRESS
                     and flag not in documented and flag.replace("--no-", "--", 1) not in documented)
    assert not missing, f"serve flags without documentation: {missing}"


def test_the_compatibility_table_s_flags_are_the_ones_serve_takes():
    """Supported and different rows name flags that parse; a "not yet" row's flags are absent or refused when
    given (argparse exits naming them)."""
    flags = _serve_flags()
    rows = _compatibility_rows()
    assert rows, "docs/vllm-compatibility.md has no table rows"
    for named, status in rows:
        for flag in named:
            if not flag.startswith("--"):
                continue
            if status == "not yet":
                action = flags.get(flag)
                refused = action is None or type(action).__name__ == "_Unsupported"
                assert refused, f"{flag}: docs/vllm-compatibility.md says 'not yet' but serve takes it"
            else:
                assert flag in flags, f"{flag}: docs/vllm-compatibility.md says {status!r} but serve does not take it"

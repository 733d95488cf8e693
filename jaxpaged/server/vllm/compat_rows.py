"""One row of docs/vllm-compatibility.md's tables of vLLM's serve flags and request keys, as data.

The rows live in compat_flag_rows.py and compat_key_rows.py; server/compat_checks.py holds each status to the parser's
and the request validator's behaviour, and compat_docs.py renders the tables into the page. A row cites its tests as the
page shows them: `test_x.py::test_name` for a file under tests/server/, `tests/<dir>/test_y.py` elsewhere, and
`::test_name` for another test of the file cited just before it in the same row; anything after the first space is shown
as written (`test_bad_input.py (cases a, b)`).
"""

import dataclasses
import typing
from typing import Literal

Status = Literal["supported", "different", "accepted no-op", "not yet", "jaxpaged only"]
"""supported: vLLM's name and behaviour; different: accepted, with a difference the note states; accepted no-op:
accepted and logged once at start-up, changing nothing here; not yet: refused by name; jaxpaged only: a flag vLLM
does not have."""
STATUSES: tuple[str, ...] = typing.get_args(Status)


def _code(text: str) -> str:
    return f"`{text}`"


def cited_test(reference: str) -> str:
    """A test reference as the page shows it: the reference in backticks, any remark after it as written."""
    reference, _, remark = reference.partition(" ")
    return _code(reference) + (f" {remark}" if remark else "")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Row:
    status: Status
    note: str = ""
    tests: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status: {self.status!r} is not one of {STATUSES}")

    def notes_cell(self) -> str:
        """The "notes / test" cell: the note, then the tests that prove it."""
        return " ".join(part for part in (self.note, ", ".join(map(cited_test, self.tests))) if part)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlagRow(_Row):
    """A row of the command-line tables: the serve flags it is about (every spelling, short forms too)."""

    flags: tuple[str, ...] = ()
    label: str = ""
    """The first cell, when it says more than the flags in backticks (a metavar, a positional, alternatives)."""

    def flag_cell(self) -> str:
        return self.label or ", ".join(map(_code, self.flags))


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyRow(_Row):
    """A row of the request-key table: the keys it is about, `chat:` or `completions:` before a key of one endpoint
    only, `outer.inner` for a key inside an object."""

    keys: tuple[str, ...] = ()
    label: str = ""

    def key_cell(self) -> str:
        return self.label or ", ".join(_code(key.partition(":")[2] or key) for key in self.keys)

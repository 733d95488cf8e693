"""Holds docs/vllm-compatibility.md's rows (server/vllm/compat_*_rows.py) to the code, so that a status cannot drift
from what the server does. It sits at the top of the server because it reads every layer: the serve parser, vllm/'s
flag lists and request validator, and openai/'s request schemas.

  - flags: a "not yet" flag is refused when given (argparse exits naming it); an "accepted no-op" flag parses into
    the start-up warning that names it (flags.py's and launch_flags.py's no-op lists); "supported", "different" and
    "jaxpaged only" flags are ones the serve parser takes as real flags. Every no-op and every refused vLLM flag has
    a row, and no flag has two;
  - request keys: a "not yet" key is a 400 naming it (request_keys.py), on the endpoints the row names; a supported
    or different key is one the endpoint's request schema reads (or prompt truncation, which reads its key itself)
    and is not refused. Every refused key has a row.
"""

import argparse
import contextlib
import io
import re
import typing
from collections.abc import Iterable
from typing import Any, Optional, Union

from pydantic import BaseModel

from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.prompt_truncation import KEY as TRUNCATION_KEY
from jaxpaged.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from jaxpaged.server.vllm import flags, launch_flags
from jaxpaged.server.vllm.compat_flag_rows import JAXPAGED_FLAG_ROWS, VLLM_FLAG_ROWS
from jaxpaged.server.vllm.compat_key_rows import KEY_ROWS
from jaxpaged.server.vllm.compat_rows import FlagRow, KeyRow
from jaxpaged.server.vllm.request_keys import refused_keys, reject_unhonoured_keys

_FLAG_IN_TEXT = re.compile(r"`(--?[a-zA-Z][a-zA-Z0-9-]*[a-zA-Z0-9])(?![a-zA-Z0-9-])")
_ENDPOINTS = {"chat": (True,), "completions": (False,), "": (True, False)}


def serve_parser() -> argparse.ArgumentParser:
    """`jaxpaged serve`'s argument parser (the subcommand's own)."""
    from jaxpaged.cli import build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return commands.choices["serve"]


def no_op_flags() -> set[str]:
    """The vLLM flags accepted with one start-up line saying they change nothing here."""
    return {*flags.IGNORED_SWITCHES, *flags.IGNORED_WITH_VALUE, *launch_flags.LOGGED_SWITCHES,
            *launch_flags.LOGGED_WITH_VALUE}


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[Optional[argparse.Namespace], str]:
    """The namespace (None when argparse exits) and what argparse wrote to stderr."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            return parser.parse_args(argv), errors.getvalue()
        except SystemExit:
            return None, errors.getvalue()


def _start_up_lines(namespace: argparse.Namespace) -> list[str]:
    return flags.ignored_flag_warnings(getattr(namespace, flags.IGNORED_DEST)) + \
        launch_flags.logged_flag_lines(namespace)


def _flag_problems(row: FlagRow, parser: argparse.ArgumentParser, no_ops: set[str]) -> Iterable[str]:
    named = set(_FLAG_IN_TEXT.findall(row.flag_cell()))
    if named != set(row.flags):
        yield f"{row.flag_cell()}: the cell names {sorted(named)}, the row's flags are {sorted(row.flags)}"
    actions = parser._option_string_actions
    for flag in row.flags:
        action = actions.get(flag)
        kind = type(action).__name__ if action is not None else None
        argv = [flag] if action is not None and action.nargs == 0 else [flag, "1"]
        if row.status == "not yet":
            namespace, errors = _parse(parser, argv)
            if namespace is not None or not any(name in errors for name in (action.option_strings if action
                                                                            else (flag,))):
                yield f"{flag}: 'not yet', but `jaxpaged serve {' '.join(argv)}` is not refused naming it"
        elif row.status == "accepted no-op":
            namespace = _parse(parser, argv)[0] if flag in no_ops else None
            if namespace is None or not any(line.startswith(flag + ":") for line in _start_up_lines(namespace)):
                yield f"{flag}: 'accepted no-op', but it is not in the warned no-op lists (server/vllm/flags.py, " \
                      f"launch_flags.py)"
        elif action is None or kind == "_Unsupported":
            yield f"{flag}: {row.status!r}, but the serve parser refuses it"
        elif flag in no_ops:
            yield f"{flag}: {row.status!r}, but it is a warned no-op: mark it 'accepted no-op'"


def flag_row_problems(rows: tuple[FlagRow, ...] = VLLM_FLAG_ROWS + JAXPAGED_FLAG_ROWS) -> list[str]:
    """Every way the flag rows contradict the serve parser (empty: none)."""
    parser, no_ops = serve_parser(), no_op_flags()
    problems = [problem for row in rows for problem in _flag_problems(row, parser, no_ops)]
    seen: dict[str, str] = {}
    for row in rows:
        for flag in row.flags:
            if flag in seen:
                problems.append(f"{flag}: in two rows ({seen[flag]!r} and {row.flag_cell()!r})")
            seen[flag] = row.flag_cell()
    by_status = {flag: row.status for row in rows for flag in row.flags}
    problems += [f"{flag}: a warned no-op without an 'accepted no-op' row" for flag in sorted(no_ops)
                 if by_status.get(flag) != "accepted no-op"]
    problems += [f"{flag}: refused by the parser without a 'not yet' row" for flag in sorted(flags.UNSUPPORTED)
                 if by_status.get(flag) != "not yet"]
    return problems


def _endpoint_keys(row: KeyRow) -> Iterable[tuple[str, bool]]:
    """(key, chat?) for every key a row names, on each endpoint it names."""
    for spelled in row.keys:
        endpoint, _, key = spelled.rpartition(":")
        for chat in _ENDPOINTS[endpoint]:
            yield key, chat


def _value_that_asks(off: Any) -> Any:
    """A value other than null and the key's "off" value."""
    if isinstance(off, bool):
        return not off
    return "x" if off is None else off + 1


def _reads(model: type[BaseModel], key: str) -> bool:
    """Whether the request schema has `key` (`outer.inner` inside a nested object), by name or alias."""
    outer, _, inner = key.partition(".")
    field = next((field for name, field in model.model_fields.items() if outer in (name, field.alias)), None)
    if field is None or not inner:
        return field is not None
    nested = [arg for arg in typing.get_args(field.annotation) or (field.annotation,)
              if isinstance(arg, type) and issubclass(arg, BaseModel)]
    return any(_reads(arg, inner) for arg in nested)


def _key_problems(row: KeyRow) -> Iterable[str]:
    for spelled in row.keys:
        if not re.search(rf"\b{re.escape(spelled.rpartition(':')[2].split('.')[-1])}\b", row.key_cell()):
            yield f"{spelled}: not named in its row's cell {row.key_cell()!r}"
    for key, chat in _endpoint_keys(row):
        endpoint = "chat" if chat else "completions"
        refused = refused_keys(chat)
        if row.status == "not yet":
            outer, _, inner = key.rpartition(".")
            value = _value_that_asks(refused.get(key))
            payload = {outer: {inner: value}} if outer else {key: value}
            try:
                reject_unhonoured_keys(payload, chat=chat)
                yield f"{endpoint} {key}: 'not yet', but {payload} is not refused"
            except APIError as error:
                if error.param != key:
                    yield f"{endpoint} {key}: 'not yet', but the 400 names {error.param!r}"
        elif key in refused:
            yield f"{endpoint} {key}: {row.status!r}, but request_keys.py refuses it"
        elif key != TRUNCATION_KEY and not _reads(ChatCompletionRequest if chat else CompletionRequest, key):
            yield f"{endpoint} {key}: {row.status!r}, but the request schema does not read it"


def key_row_problems(rows: tuple[KeyRow, ...] = KEY_ROWS) -> list[str]:
    """Every way the request-key rows contradict the request validator (empty: none)."""
    problems = [problem for row in rows for problem in _key_problems(row)]
    not_yet = {pair for row in rows if row.status == "not yet" for pair in _endpoint_keys(row)}
    for chat in (True, False):
        problems += [f"{'chat' if chat else 'completions'} {key}: refused by request_keys.py without a 'not yet' row"
                     for key in sorted(refused_keys(chat)) if (key, chat) not in not_yet]
    return problems


def untested_rows(rows: Iterable[Union[FlagRow, KeyRow]]) -> list[str]:
    """The rows that cite no test, in their tests or their note."""
    return [f"{row.flag_cell() if isinstance(row, FlagRow) else row.key_cell()}: cites no test" for row in rows
            if not row.tests and "test_" not in row.note]


def registry_problems() -> list[str]:
    """Every contradiction between docs/vllm-compatibility.md's rows and the code, and every row without a test
    (empty: none)."""
    return flag_row_problems() + key_row_problems() + untested_rows(VLLM_FLAG_ROWS + JAXPAGED_FLAG_ROWS + KEY_ROWS)

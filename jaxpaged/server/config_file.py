"""`jaxpaged serve --config FILE.yaml` with any serve flag in the file, as vLLM's --config takes them.

vLLM's YAML holds every flag by its long name (dashes or underscores): model, host, port, served-model-name ... The
engine options in it stay cli_options.options_from_file's (so their errors name the file); every other key becomes
its flag, placed before the command line's own flags so that those win (as in vLLM). The file's `model` is the
fallback of the positional MODEL and --model.
"""

import argparse
import json
import sys
from typing import Any, Optional

import yaml

CONFIG_MODEL_DEST = "config_file_model"
"""The namespace attribute holding the file's `model` (a fallback: the command line's model wins)."""
SERVE_KEYS_DEST = "config_file_serve_keys"
"""The namespace attribute listing the file's keys read as serve flags (options_from_file leaves them alone)."""


def _config_path(argv: list[str]) -> Optional[str]:
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def _serve_parser(parser: argparse.ArgumentParser) -> Optional[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get("serve")
    return None


def _as_flags(flag: str, action: argparse.Action, value: Any) -> list[str]:
    """A YAML value as the command-line words of `flag`."""
    if action.nargs == 0:  # a switch: true gives it, false leaves it (or its --no- form) out
        if isinstance(action, argparse.BooleanOptionalAction) and value is False:
            return ["--no-" + flag[2:]]
        return [flag] if value else []
    if isinstance(value, list) and action.nargs in ("+", "*"):
        return [flag, *map(str, value)]
    if isinstance(value, (dict, list)):  # a JSON-valued flag (--allowed-origins, --speculative-config)
        return [flag, json.dumps(value)]
    if isinstance(value, bool):
        return [flag, str(value).lower()]
    return [flag, str(value)]


def serve_config_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str], Any]:
    """argv with the serve flags of its --config file put before its own flags, the keys moved, and the file's
    model (None if it names none). Files that do not parse are left to options_from_file, which names them."""
    serve = _serve_parser(parser)
    path = _config_path(argv)
    if serve is None or path is None or "serve" not in argv:
        return argv, [], None
    try:
        with open(path, encoding="utf-8") as file:
            data = yaml.safe_load(file)
    except (OSError, yaml.YAMLError):
        return argv, [], None
    if not isinstance(data, dict):
        return argv, [], None
    from jaxpaged.cli_options import engine_options

    engine_names = set(engine_options())
    words, moved, model = [], [], None
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in engine_names:
            continue
        if name == "model":
            model, moved = value, [*moved, key]
            continue
        action = serve._option_string_actions.get("--" + name.replace("_", "-"))
        if action is None:
            continue  # options_from_file names the unknown key and the file
        words += _as_flags("--" + name.replace("_", "-"), action, value)
        moved.append(key)
    at = argv.index("serve") + 1
    return [*argv[:at], *words, *argv[at:]], moved, model


def parse_command_line(parser: argparse.ArgumentParser, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """parser.parse_args, with `serve --config FILE`'s serve flags read from the file."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, moved, model = serve_config_flags(parser, argv)
    args = parser.parse_args(argv)
    setattr(args, SERVE_KEYS_DEST, moved)
    setattr(args, CONFIG_MODEL_DEST, model)
    return args

"""Engine options as command-line flags, shared by `serve` and `generate`, generated from EngineConfig.

One loop over the config dataclasses makes a flag per field: --field-name (a bool field: --x/--no-x), its type and
choices from the annotation, its help from the field's docstring in config.py and its default from the dataclass,
so the flags, their defaults and their help cannot drift from the config. Every flag's argparse default is None
("not given"): the config's own default applies.

An option's value comes from, first to last: its flag, the `--config FILE.yaml` mapping, the environment variable
JAXPAGED_<FIELD_NAME> (JAXPAGED_MAX_MODEL_LEN=4096), EngineConfig's default. Only the names of fields are read from
the environment (JAXPAGED_CPU_MATMUL and JAXPAGED_CPU_ATTENTION are the kernel fields'); other JAXPAGED_* variables
(JAXPAGED_API_KEY is the server's) are not engine options and are left alone.
"""

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import types
import typing
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Literal, Optional, Union

import yaml

from jaxpaged import config, speculative_config, vllm_values
from jaxpaged.checks import parse_byte_size

ENV_PREFIX = config.ENV_PREFIX

# vLLM's short forms, and the spelling of the prefix-caching switch that predates the generated flags.
_ALIASES = {"tensor_parallel_size": ("-tp",), "data_parallel_size": ("-dp",), "quantization": ("-q",),
            "enable_prefix_caching": ("--prefix-caching",)}
# Fields whose int is a byte count: their flags take "8GiB" (the annotation alone cannot say so).
_BYTE_SIZES = ("kv_cache_memory", "kv_offload_memory", "kv_offload_dir_max_bytes")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class EngineOption:
    """One flat engine option (a name EngineConfig.from_options takes) and how its text is read."""

    name: str
    default: Any
    kind: Any
    """The annotation without its Optional: int, float, str, bool or a Literal."""
    doc: str

    @property
    def is_bool(self) -> bool:
        return self.kind is bool

    @property
    def choices(self) -> Optional[tuple]:
        return typing.get_args(self.kind) if typing.get_origin(self.kind) is Literal else None

    def parse(self, text: str) -> Any:
        """The value of a flag's or an environment variable's text; ValueError saying what was expected."""
        if self.name in _BYTE_SIZES:
            return parse_byte_size(text, self.name)
        if self.name == "max_model_len":
            return vllm_values.max_model_len(text)
        if self.choices is not None:
            return vllm_values.choice(self.name, text, self.choices)
        if self.is_bool:
            if text.strip().lower() in _TRUE + _FALSE:
                return text.strip().lower() in _TRUE
            raise ValueError(f"{self.name}: must be a bool ({'/'.join(_TRUE)} or {'/'.join(_FALSE)}), got {text!r}")
        if self.kind is int:
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{self.name}: must be an int, got {text!r}") from None
        if self.kind is float:
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"{self.name}: must be a number, got {text!r}") from None
        return text  # str and Literal fields: the config checks the choices and names the field

    def shown_default(self) -> str:
        """The default as a user would type it ("16GiB" for a byte size)."""
        if self.name in _BYTE_SIZES and isinstance(self.default, int) and self.default > 0:
            for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
                if self.default % size == 0:
                    return f"{self.default // size}{unit}"
        return str(self.default)


@functools.cache
def field_docs() -> dict[str, str]:
    """Each config field's docstring (the string literal under it in config.py or speculative_config.py, where the
    speculative group lives), whitespace collapsed."""
    docs = {}
    source = inspect.getsource(config) + "\n" + inspect.getsource(speculative_config)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for statement, following in zip(node.body, node.body[1:]):
                if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                        and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                        and isinstance(following.value.value, str)):
                    docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def _without_optional(kind: Any) -> Any:
    if typing.get_origin(kind) in (Union, types.UnionType):
        kinds = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if len(kinds) == 1:
            return kinds[0]
    return kind


def _walk(cls: type) -> Iterator[EngineOption]:
    # A field holding a dataclass (cache, scheduler) is a group: from_options takes its fields flat.
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            yield from _walk(kind)
        else:
            yield EngineOption(field.name, field.default, _without_optional(kind), field_docs().get(field.name, ""))


@functools.cache
def engine_options() -> dict[str, EngineOption]:
    """Every flat engine option by name, in the config's order."""
    return {option.name: option for option in _walk(config.EngineConfig)}


def _argparse_type(option: EngineOption) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as error:  # argparse shows an ArgumentTypeError's own message
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = option.name
    return parse


def _metavar(option: EngineOption) -> Optional[str]:
    return "{" + ",".join(map(str, option.choices)) + "}" if option.choices else None


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --model, --revision, --config and a flag for every engine option to `parser`."""
    parser.add_argument("--model", default=None,
                        help="HF checkpoint dir, .gguf file, converted checkpoint or Hugging Face repo id "
                             "(org/name; fetched through the HF cache) (default: embedded SmolLM2-135M)")
    # Not an engine option: it selects what load_model reads, so engine_options_from_args leaves it out.
    parser.add_argument("--revision", default=None,
                        help="branch, tag or commit of a Hugging Face --model (default: the repo's default branch)")
    group = parser.add_argument_group(
        "engine options", f"Each also reads the environment variable {ENV_PREFIX}<OPTION> (for --max-model-len: "
                          f"{ENV_PREFIX}MAX_MODEL_LEN). A flag beats --config, which beats the environment. Other "
                          f"{ENV_PREFIX}* variables ({ENV_PREFIX}API_KEY) are no engine options.")
    group.add_argument("--config", dest="engine_config_file", metavar="FILE.yaml", default=None,
                       help="a YAML mapping of engine options (max_model_len: 4096, or max-model-len)")
    for option in engine_options().values():
        flags = ["--" + option.name.replace("_", "-"), *_ALIASES.get(option.name, ())]
        help_text = f"{option.doc} (default: {option.shown_default()})".replace("%", "%%")
        if option.is_bool:
            group.add_argument(*flags, dest=option.name, action=argparse.BooleanOptionalAction, default=None,
                               help=help_text)
        else:
            # NOTE: the type checks the choices (naming the supported ones and taking vLLM's aliases), so no
            # argparse choices=, whose check would refuse an alias such as --dtype half.
            group.add_argument(*flags, dest=option.name, type=_argparse_type(option), default=None,
                               metavar=_metavar(option), help=help_text)


def options_from_file(path: str, other_keys: Collection[str] = ()) -> dict[str, Any]:
    """The engine options of a YAML file; ValueError naming the file (and the key) when it has anything else but
    `other_keys` (the serve flags `jaxpaged serve` read from it)."""
    with open(path, encoding="utf-8") as file:  # FileNotFoundError: the CLI reports it
        try:
            data = yaml.safe_load(file)
        except yaml.YAMLError as error:
            raise ValueError(f"{path}: not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a mapping of engine options, got a {type(data).__name__}")
    known = engine_options()
    options = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if key in other_keys:
            continue
        if name not in known:
            raise ValueError(f"{path}: unknown engine option {key!r} (known: {', '.join(known)})")
        # YAML types numbers and bools itself; a quoted one (or "8GiB") is read as its flag reads it.
        try:
            options[name] = known[name].parse(value) if isinstance(value, str) else value
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    return options


def options_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The engine options set by JAXPAGED_<FIELD> variables; ValueError naming the variable for a bad value."""
    options = {}
    for name, option in engine_options().items():
        variable = ENV_PREFIX + name.upper()
        if variable in environ:
            try:
                options[name] = option.parse(environ[variable])
            except ValueError as error:
                raise ValueError(f"{variable}: {error}") from None
    return options


def engine_options_from_args(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> dict:
    """The engine options the user set by flag, --config file or environment (unset ones are left out)."""
    environ = os.environ if environ is None else environ
    path = getattr(args, "engine_config_file", None)
    from_env = options_from_env(environ)
    from_file = options_from_file(path, getattr(args, "config_file_serve_keys", None) or ()) if path else {}
    from_flags = {name: getattr(args, name) for name in engine_options() if getattr(args, name, None) is not None}
    options = {**from_env, **from_file, **from_flags}
    # Where a value came from, for the config's own checks (block_size >= 1, dtype's choices): the error should
    # name the variable or the file, not only the field, since the command line does not show it.
    sources = {**{name: ENV_PREFIX + name.upper() for name in from_env}, **{name: path for name in from_file}}
    for name in from_flags:
        sources.pop(name, None)
    if sources:
        try:
            config.EngineConfig.from_options(**options)
        except ValueError as error:
            field = str(error).split(":", 1)[0]
            if field in sources:
                raise ValueError(f"{sources[field]}: {error}") from None
            raise
    return options

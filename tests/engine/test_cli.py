"""The `jaxpaged` console script: help on every command, generate streams text, convert round-trips a model."""

import logging
import subprocess
import sys

import pytest

from jaxpaged.cli import main
from jaxpaged.config import EngineConfig
from jaxpaged.engine import LLMEngine
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.loader import load_model
from tests.conftest import TINY_ENGINE_OPTIONS

# One worker builds the shared tiny engine (it compiles) for every test that uses it.
pytestmark = pytest.mark.xdist_group("tiny_llm")

JAXPAGED = [sys.executable, "-m", "jaxpaged.cli"]
TINY_ENGINE_FLAGS = [arg for name, value in TINY_ENGINE_OPTIONS.items()
                     for arg in (f"--{name.replace('_', '-')}", str(value))]
"""tiny_llm's options as flags: the command's warm-up loads the programs tiny_llm compiled from the session's XLA
cache (its own limits compiled about 20 programs of their own)."""


# In this process: the parser is the console script's (a fresh process each cost ~3 s of CPU for the imports).
# The two entry points, `python -m jaxpaged` and `python -m jaxpaged.cli`, each keep a subprocess test below.
@pytest.mark.parametrize("command", [[], ["serve"], ["generate"], ["bench"], ["convert"]])
def test_every_command_has_help(command, capsys):
    """`jaxpaged [COMMAND] --help` prints the command's usage and exits 0."""
    with pytest.raises(SystemExit) as exited:
        main(command + ["--help"])
    assert exited.value.code == 0, capsys.readouterr().err
    assert f"usage: jaxpaged {' '.join(command)}".rstrip() in capsys.readouterr().out


def test_python_dash_m_jaxpaged_is_the_command():
    """`python -m jaxpaged serve --help` is the `jaxpaged serve` command (as `python -m vllm` is vLLM's)."""
    result = subprocess.run([sys.executable, "-m", "jaxpaged", "serve", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: jaxpaged serve" in result.stdout


def test_generate_streams_the_greedy_text(tiny_llm, tiny_model_dir):
    expected = tiny_llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    result = subprocess.run(
        JAXPAGED + ["generate", "Hello", "--model", str(tiny_model_dir), "--max-tokens", "8", *TINY_ENGINE_FLAGS],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == expected.outputs[0].text + "\n"
    # At the default log level the start-up plan (dtype, kernels, KV, memory) reaches stderr, text stays on stdout.
    assert "INFO jaxpaged.runner.startup: start-up plan: devices" in result.stderr
    assert "dtype float32" in result.stderr and "memory plan per device" in result.stderr


def test_generate_reports_bad_options_by_name(tiny_model_dir, capsys):
    """A bad option ends `jaxpaged generate` with code 2 and an error naming the field, before any engine is built
    (in this process: the command line's own main)."""
    assert main(["generate", "Hi", "--model", str(tiny_model_dir), "--block-size", "0"]) == 2
    assert "jaxpaged generate: error: block_size" in capsys.readouterr().err


def test_convert_round_trips_through_orbax(tiny_llm, tiny_model_dir, tmp_path):
    destination = tmp_path / "converted"
    assert main(["convert", str(tiny_model_dir), str(destination)]) == 0
    converted = load_model(str(destination))
    original = load_model(str(tiny_model_dir))
    assert converted.config == original.config
    for name, value in original.params.items():
        assert (converted.params[name] == value).all(), name
    engine = LLMEngine(converted, EngineConfig.from_options(**TINY_ENGINE_OPTIONS), warmup=False)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("x", "Round trip", params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
    direct = tiny_llm.generate("Round trip", params, use_tqdm=False)
    assert outputs[0].outputs[0].token_ids == direct[0].outputs[0].token_ids


@pytest.mark.parametrize("argv, expected", [(["serve"], None), (["serve", "org/model"], "org/model"),
                                            (["serve", "--model", "org/model"], "org/model"),
                                            (["serve", "org/model", "--model", "org/model"], "org/model")])
def test_serve_takes_the_model_as_vllm_does_positionally_or_by_flag(argv, expected):
    from jaxpaged.cli import build_parser
    from jaxpaged.server.launcher import model_argument

    assert model_argument(build_parser().parse_args(argv)) == expected


def test_two_different_models_are_refused_naming_both():
    from jaxpaged.cli import build_parser
    from jaxpaged.server.launcher import model_argument

    with pytest.raises(ValueError, match="model: given twice.*'a/b'.*'c/d'"):
        model_argument(build_parser().parse_args(["serve", "a/b", "--model", "c/d"]))


@pytest.mark.parametrize("argv, level", [([], logging.INFO), (["--log-level", "warning"], logging.WARNING)])
def test_serve_sets_jaxpaged_logging_before_anything_else(argv, level, capsys):
    """--log-level (INFO by default) is in force before the model loads: here the model is missing."""
    assert main(["serve", "/no/such/model-dir", *argv]) == 2
    assert logging.getLogger("jaxpaged").level == level
    assert "jaxpaged serve: model: '/no/such/model-dir' does not exist" in capsys.readouterr().err

"""Engine flags generated from EngineConfig: one per field, its docstring and default in --help, and the
--config file and JAXPAGED_* environment below the flags (flag > file > environment > default)."""

import argparse
import dataclasses
import re
import typing

import pytest

from jaxpaged.cli_options import add_engine_arguments, engine_options, engine_options_from_args, field_docs
from jaxpaged.config import EngineConfig


def _leaf_fields(cls: type = EngineConfig) -> dict[str, dataclasses.Field]:
    """The flat engine options, walked from the dataclasses themselves (not from the code under test)."""
    fields = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            fields.update(_leaf_fields(hints[field.name]))
        else:
            fields[field.name] = field
    return fields


FIELDS = _leaf_fields()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    # The outer environment must not set options behind the tests' backs.
    for name in FIELDS:
        monkeypatch.delenv("JAXPAGED_" + name.upper(), raising=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxpaged test")
    add_engine_arguments(parser)
    return parser


def _options(flags: list[str]) -> dict:
    return engine_options_from_args(_parser().parse_args(flags))


def test_every_config_field_has_a_documented_flag():
    parser = _parser()
    for name in FIELDS:
        flag = "--" + name.replace("_", "-")
        assert flag in parser._option_string_actions, flag
        assert parser._option_string_actions[flag].dest == name
        assert field_docs()[name], f"{name} has no docstring in config.py"
    assert list(engine_options()) == list(FIELDS)
    assert field_docs()["block_size"] == "Tokens per KV block (the kernels call it a page)."
    # Nothing given: nothing set, so every EngineConfig default applies.
    assert _options([]) == {}
    assert EngineConfig.from_options(**_options([])) == EngineConfig()


def test_help_shows_each_docstring_and_the_dataclass_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps to the terminal: one line per flag
    text = " ".join(_parser().format_help().split())
    for name, field in FIELDS.items():
        flag, option = "--" + name.replace("_", "-"), engine_options()[name]
        match = re.search(re.escape(flag) + r"[ ,A-Za-z0-9_{}-]*? " + re.escape(field_docs()[name])
                          + r" \(default: ([^)]*)\)", text)
        assert match, f"{flag}: help without its docstring and default"
        shown = match.group(1)
        if field.default is None or isinstance(field.default, bool):
            assert shown == str(field.default), flag
        else:  # read back as the flag reads it: "16GiB" is the byte count
            assert option.parse(shown) == field.default, flag


def test_serve_help_is_generated_from_the_config(capsys, monkeypatch):
    from jaxpaged.cli import main

    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-model-len MAX_MODEL_LEN Longest prompt + output, in tokens. None: the model's context length" in text
    assert "(default: 16GiB)" in text and "--config FILE.yaml" in text and "JAXPAGED_MAX_MODEL_LEN" in text


def test_the_flags_the_readme_and_tests_use_keep_working():
    assert _options(["-tp", "2", "-dp", "3", "--no-prefix-caching", "--no-async-scheduling", "--advisor-log-text",
                     "--kv-offload-memory", "8GiB", "--kv-offload-dir-max-bytes", "100GiB", "--dtype", "float32",
                     "--compilation-cache-dir", "", "--scheduling-policy", "priority"]) == dict(
        tensor_parallel_size=2, data_parallel_size=3, enable_prefix_caching=False, async_scheduling=False,
        advisor_log_text=True, kv_offload_memory=8 * 2**30, kv_offload_dir_max_bytes=100 * 2**30, dtype="float32",
        compilation_cache_dir="", scheduling_policy="priority")
    assert _options(["--async-scheduling", "--prefix-caching"]) == dict(async_scheduling=True,
                                                                        enable_prefix_caching=True)


def test_vllm_engine_flags_keep_vllm_spellings():
    """The engine flags docs/vllm-compatibility.md lists as supported parse under vLLM's own names."""
    assert _options(["--max-num-seqs", "8", "--max-num-batched-tokens", "256", "--block-size", "32", "--seed", "5",
                     "--no-enable-prefix-caching", "--tensor-parallel-size", "2", "--data-parallel-size", "2",
                     "--long-prefill-token-threshold", "64", "--max-model-len", "2048", "-q", "int8",
                     "--gpu-memory-utilization", "0.8"]) == dict(
        max_num_seqs=8, max_num_batched_tokens=256, block_size=32, seed=5, enable_prefix_caching=False,
        tensor_parallel_size=2, data_parallel_size=2, long_prefill_token_threshold=64, max_model_len=2048,
        quantization="int8", gpu_memory_utilization=0.8)
    assert _options(["--enable-prefix-caching"]) == dict(enable_prefix_caching=True)


@pytest.mark.parametrize("flags, message", [
    (["--kv-offload-memory", "big"], "argument --kv-offload-memory: kv_offload_memory: must be a number of bytes"),
    (["--max-model-len", "long"], "argument --max-model-len: max_model_len: must be an int"),
    (["--dtype", "float8"], "argument --dtype: dtype: 'float8' is not supported by jaxpaged; supported: auto"),
])
def test_bad_flag_values_are_refused_by_name(flags, message, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(flags)
    assert message in capsys.readouterr().err


def test_flag_beats_file_beats_environment_beats_default(tmp_path, monkeypatch):
    config_file = tmp_path / "engine.yaml"
    config_file.write_text("max_model_len: 1024\nmax-num-seqs: 8\nblock_size: 32\nkv_offload_memory: 1GiB\n"
                           "enable_prefix_caching: true\n")
    monkeypatch.setenv("JAXPAGED_MAX_MODEL_LEN", "4096")
    monkeypatch.setenv("JAXPAGED_MAX_NUM_SEQS", "16")
    monkeypatch.setenv("JAXPAGED_SEED", "7")
    monkeypatch.setenv("JAXPAGED_ASYNC_SCHEDULING", "off")
    options = _options(["--config", str(config_file), "--max-model-len", "512"])
    assert options == dict(max_model_len=512, max_num_seqs=8, block_size=32, kv_offload_memory=2**30,
                           enable_prefix_caching=True, seed=7, async_scheduling=False)
    config = EngineConfig.from_options(**options)
    assert (config.scheduler.max_model_len, config.scheduler.max_num_seqs, config.cache.block_size, config.seed) == \
        (512, 8, 32, 7)
    assert config.scheduler.max_num_batched_tokens == 512  # nobody set it: the dataclass default
    # Without the file the environment shows through; without both, the defaults.
    assert _options([])["max_num_seqs"] == 16
    monkeypatch.delenv("JAXPAGED_MAX_NUM_SEQS")
    assert "max_num_seqs" not in _options([])


def test_the_environment_reads_only_field_names(monkeypatch):
    for name in ("JAXPAGED_API_KEY", "JAXPAGED_NOT_AN_OPTION"):
        monkeypatch.setenv(name, "xla")
    assert _options([]) == {}
    # The kernel variables are the kernel fields' own names.
    monkeypatch.setenv("JAXPAGED_CPU_MATMUL", "xla")
    monkeypatch.setenv("JAXPAGED_CPU_ATTENTION", "jnp")
    assert _options([]) == dict(cpu_matmul="xla", cpu_attention="jnp")
    monkeypatch.delenv("JAXPAGED_CPU_MATMUL")
    monkeypatch.delenv("JAXPAGED_CPU_ATTENTION")
    monkeypatch.setenv("JAXPAGED_ENABLE_PREFIX_CACHING", "0")
    monkeypatch.setenv("JAXPAGED_KV_OFFLOAD_DIR_MAX_BYTES", "2GiB")
    assert _options([]) == dict(enable_prefix_caching=False, kv_offload_dir_max_bytes=2 * 2**30)


@pytest.mark.parametrize("variable, value, message", [
    ("JAXPAGED_MAX_MODEL_LEN", "lots", "JAXPAGED_MAX_MODEL_LEN: max_model_len: must be an int such as 4096"),
    ("JAXPAGED_ENABLE_PREFIX_CACHING", "maybe", "JAXPAGED_ENABLE_PREFIX_CACHING: enable_prefix_caching: must be a"),
    ("JAXPAGED_KV_OFFLOAD_MEMORY", "big", "JAXPAGED_KV_OFFLOAD_MEMORY: kv_offload_memory: must be a number of"),
    # Values of the right type that the config refuses name the variable too.
    ("JAXPAGED_BLOCK_SIZE", "0", "JAXPAGED_BLOCK_SIZE: block_size: must be a positive int, got 0"),
    ("JAXPAGED_DTYPE", "float8", "JAXPAGED_DTYPE: dtype: 'float8' is not supported by jaxpaged; supported:"),
])
def test_a_bad_environment_value_names_the_variable(variable, value, message, monkeypatch):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        _options([])


def test_the_command_reports_a_bad_environment_value(capsys, monkeypatch, tmp_path):
    from jaxpaged.cli import main

    monkeypatch.setenv("JAXPAGED_MAX_NUM_SEQS", "many")
    assert main(["generate", "Hi", "--model", str(tmp_path / "never-loaded")]) == 2
    assert "JAXPAGED_MAX_NUM_SEQS: max_num_seqs: must be an int, got 'many'" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("max_model_len: 64\nmax_modle_len: 5\n", "unknown engine option 'max_modle_len'"),
    ("model: org/name\n", "unknown engine option 'model'"),
    ("- max_model_len\n", "must be a mapping of engine options, got a list"),
    ("max_model_len: [1\n", "not valid YAML"),
    ("kv_offload_memory: big\n", "kv_offload_memory: must be a number of bytes"),
    ("block_size: 0\n", "block_size: must be a positive int, got 0"),
])
def test_a_bad_config_file_names_the_file_and_the_key(text, message, tmp_path):
    config_file = tmp_path / "engine.yaml"
    config_file.write_text(text)
    with pytest.raises(ValueError, match="^" + re.escape(f"{config_file}: ") + ".*" + re.escape(message)):
        _options(["--config", str(config_file)])


def test_a_missing_config_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError):
        _options(["--config", str(tmp_path / "absent.yaml")])
    (tmp_path / "empty.yaml").write_text("")
    assert _options(["--config", str(tmp_path / "empty.yaml")]) == {}

"""vLLM launch lines that used to stop at argparse, parsed without starting a server: human-readable sizes, dtype
aliases, flags that are no-ops here (logged), unsupported values named, several API keys, VLLM_API_KEY, --config
with serve flags, LLM(...)'s vLLM keys, the opt-in queue limit and the loopback note."""

import argparse

import pytest

from jaxpaged.cli import build_parser
from jaxpaged.cli_options import engine_options_from_args
from jaxpaged.server.config_file import parse_command_line
from jaxpaged.server.context import ServerSettings
from jaxpaged.server.http.auth import BearerAuthMiddleware
from jaxpaged.server.launcher import model_argument
from jaxpaged.server.serve_flags import api_key_from, settings_from_args
from jaxpaged.server.vllm.launch_flags import logged_flag_lines, loopback_note, override_sampling_defaults
from jaxpaged.vllm_llm_options import engine_options_from_vllm
from jaxpaged.vllm_values import human_readable_int


def _args(*argv: str) -> argparse.Namespace:
    return parse_command_line(build_parser(), ["serve", *argv])


@pytest.mark.parametrize("text, expected", [("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("4096", 4096),
                                            ("1m", 1_000_000), ("2G", 2 * 2**30)])
def test_human_readable_ints_read_as_vllm_reads_them(text, expected):
    """Lower-case suffixes are decimal, upper-case binary (vLLM's human_readable_int)."""
    assert human_readable_int(text, "max_model_len") == expected


@pytest.mark.parametrize("text", ["1.5K", "32q", "", "k"])
def test_bad_human_readable_ints_are_refused_naming_the_field(text):
    """A binary suffix takes no decimals; anything else that is no int is refused."""
    with pytest.raises(ValueError, match="^max_model_len: "):
        human_readable_int(text, "max_model_len")


def test_max_model_len_takes_sizes_and_auto():
    """--max-model-len 32k is 32,000 tokens; auto is the default (the model's context, fitted to the pool)."""
    assert engine_options_from_args(_args("m", "--max-model-len", "32k"), environ={})["max_model_len"] == 32_000
    assert "max_model_len" not in engine_options_from_args(_args("m", "--max-model-len", "auto"), environ={})
    assert engine_options_from_args(_args("m"), environ={"JAXPAGED_MAX_MODEL_LEN": "2K"})["max_model_len"] == 2048


@pytest.mark.parametrize("given, dtype", [("half", "float16"), ("float", "float32"), ("bfloat16", "bfloat16")])
def test_vllm_dtype_names_are_accepted(given, dtype):
    """--dtype half / float are vLLM's names for float16 / float32."""
    assert engine_options_from_args(_args("m", "--dtype", given), environ={})["dtype"] == dtype


@pytest.mark.parametrize("argv, message", [
    (["--kv-cache-dtype", "fp8_e5m2"], "kv_cache_dtype: 'fp8_e5m2' is not supported by jaxpaged; supported: auto"),
    (["-q", "awq"], "quantization: 'awq' is not supported by jaxpaged; supported: int8"),
    (["--generation-config", "vllm"], "--generation-config: jaxpaged supports only 'auto'")])
def test_unsupported_vllm_values_are_named_with_what_is_supported(argv, message, capsys):
    """A vLLM value jaxpaged lacks stops the start, naming the flag and the supported values."""
    with pytest.raises(SystemExit):
        _args("m", *argv)
    assert message in capsys.readouterr().err


def test_no_op_flags_are_accepted_and_logged_once():
    """Chunked prefill is always on here: both spellings parse, and each is logged once with its reason."""
    args = _args("m", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--enable-chunked-prefill",
                 "--structured-outputs-config", '{"backend": "xgrammar"}', "--max-logprobs", "5",
                 "--generation-config", "auto")
    lines = logged_flag_lines(args)
    assert [line.split(":")[0] for line in lines] == ["--enable-chunked-prefill", "--no-enable-chunked-prefill",
                                                      "--structured-outputs-config", "--max-logprobs"]
    assert "cannot turn it off" in lines[1]


def test_kv_cache_memory_bytes_is_the_pool_per_device():
    """vLLM's --kv-cache-memory-bytes 8G (8 GiB per device) is kv_cache_memory, which is per device too."""
    assert engine_options_from_args(_args("m", "--kv-cache-memory-bytes", "8G"), environ={}) == \
        {"kv_cache_memory": 8 * 2**30}
    assert engine_options_from_args(_args("m", "--kv-cache-memory-bytes", "8g"), environ={}) == \
        {"kv_cache_memory": 8 * 10**9}


def test_default_chat_template_kwargs_sit_under_the_requests_own():
    """The server-wide chat_template_kwargs apply unless the request sets the same key."""
    settings = settings_from_args(_args("m", "--default-chat-template-kwargs", '{"enable_thinking": false, "a": 1}'))
    assert settings.chat_template_kwargs_for(None) == {"enable_thinking": False, "a": 1}
    assert settings.chat_template_kwargs_for({"enable_thinking": True}) == {"enable_thinking": True, "a": 1}
    assert ServerSettings().chat_template_kwargs_for({"x": 2}) == {"x": 2}


def test_override_generation_config_overrides_the_models_defaults():
    """--override-generation-config replaces the model's sampling defaults key by key; other keys are named."""
    args = _args("m", "--override-generation-config", '{"temperature": 0.5}')
    assert override_sampling_defaults({"temperature": 0.7, "top_p": 0.9}, args.override_generation_config) == \
        {"temperature": 0.5, "top_p": 0.9}
    with pytest.raises(ValueError, match="override_generation_config: unknown keys \\['max_tokens'\\]"):
        override_sampling_defaults({}, {"max_tokens": 3})


def test_several_api_keys_are_each_accepted():
    """--api-key k1 k2: a request with either key passes, any other is refused."""
    settings = settings_from_args(_args("m", "--api-key", "k1", "k2"))
    assert settings.api_key == ("k1", "k2")
    auth = BearerAuthMiddleware(app=None, api_key=settings.api_key)  # type: ignore[arg-type]
    assert auth.is_authorized(b"Bearer k1", "/v1/models") and auth.is_authorized(b"Bearer k2", "/v1/models")
    assert not auth.is_authorized(b"Bearer k3", "/v1/models") and not auth.is_authorized(b"", "/v1/models")
    assert auth.is_authorized(b"Bearer k2", "/metrics")  # the API keys guard /metrics too


def test_vllm_api_key_is_read_and_jaxpaged_s_own_variable_wins(caplog):
    """A manifest setting only VLLM_API_KEY still serves with a key; JAXPAGED_API_KEY wins when both differ."""
    assert api_key_from(None, {"VLLM_API_KEY": "v"}) == "v"
    assert api_key_from(None, {"VLLM_API_KEY": "v", "JAXPAGED_API_KEY": "j"}) == "j"
    assert "JAXPAGED_API_KEY is the key" in caplog.text
    assert api_key_from(["flag"], {"VLLM_API_KEY": "v"}) == "flag"
    assert api_key_from(None, {}) is None


def test_the_queue_limit_is_opt_in_with_vllm_s_alias():
    """No limit on queued requests unless set; --max-num-queued-reqs is vLLM's name for it."""
    assert settings_from_args(_args("m")).max_queued_requests is None
    assert settings_from_args(_args("m", "--max-num-queued-reqs", "7")).max_queued_requests == 7
    with pytest.raises(ValueError, match="max_queued_requests"):
        ServerSettings(max_queued_requests=-1)


def test_a_vllm_config_file_takes_serve_flags_and_the_command_line_wins(tmp_path):
    """model, host, port and served-model-name in vLLM's --config YAML (dashes or underscores) are read; flags on
    the command line beat the file; engine options still come from it."""
    config = tmp_path / "vllm.yaml"
    config.write_text("model: org/from-file\nhost: 0.0.0.0\nport: 9001\nserved_model_name: [a, b]\n"
                      "max-num-seqs: 8\nenable-auto-tool-choice: true\ntool-call-parser: llama3_json\n"
                      "allowed-origins: ['*']\n")
    args = _args("--config", str(config), "--port", "9002")
    assert model_argument(args) == "org/from-file" and args.host == "0.0.0.0" and args.port == 9002
    settings = settings_from_args(args)
    assert settings.served_model_names == ("a", "b") and settings.enable_auto_tool_choice
    assert settings.allowed_origins == ("*",)
    assert engine_options_from_args(args, environ={}) == {"max_num_seqs": 8}
    assert model_argument(_args("org/cli", "--config", str(config))) == "org/cli"


def test_an_unknown_key_in_the_config_file_is_named_with_the_file(tmp_path):
    """A key that is neither a serve flag nor an engine option is an error naming the file and the key."""
    config = tmp_path / "vllm.yaml"
    config.write_text("no-such-option: 1\n")
    with pytest.raises(ValueError, match="vllm.yaml: unknown engine option 'no-such-option'"):
        engine_options_from_args(_args("m", "--config", str(config)), environ={})


def test_llm_takes_vllm_s_keys():
    """LLM(trust_remote_code=True, max_model_len="32k", dtype="half") is accepted; server-only keys are named."""
    assert engine_options_from_vllm({"trust_remote_code": True, "max_model_len": "32k", "dtype": "half",
                                     "kv_cache_memory_bytes": "1G", "seed": 3}) == \
        {"max_model_len": 32_000, "dtype": "float16", "kv_cache_memory": 2**30, "seed": 3}
    for key in ("host", "api_key", "served_model_name"):
        with pytest.raises(ValueError, match=f"^{key}: a server option of `jaxpaged serve`"):
            engine_options_from_vllm({key: "x"})


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("0.0.0.0", False), ("10.0.0.5", False)])
def test_the_start_up_line_says_when_only_loopback_is_bound(host, loopback):
    """A vLLM user expects other machines to connect; the start-up line says when they cannot."""
    assert ("loopback only" in loopback_note(host)) == loopback


def test_structured_outputs_config_enable_in_reasoning_reaches_the_settings():
    """vLLM's {"enable_in_reasoning": true} lets a grammar hold inside the reasoning; unset it starts after it; a
    non-bool is refused naming the key."""
    from jaxpaged.server.serve_flags import settings_from_args

    on = settings_from_args(_args("m", "--structured-outputs-config", '{"enable_in_reasoning": true}'))
    assert on.structured_outputs_in_reasoning
    assert not settings_from_args(_args("m")).structured_outputs_in_reasoning
    with pytest.raises(SystemExit):
        _args("m", "--structured-outputs-config", '{"enable_in_reasoning": "yes"}')

"""`jaxpaged serve`'s vLLM flags, parsed without starting anything: names, chat template sources, CORS, TLS options
reaching uvicorn, vLLM flags ignored with a warning or refused by name, and --tokenizer."""

import argparse

import pytest
import uvicorn

from jaxpaged.cli import build_parser
from jaxpaged.cli_options import engine_options_from_args
from jaxpaged.config import EngineConfig
from jaxpaged.server.context import ServerSettings
from jaxpaged.server.serve_flags import settings_from_args, uvicorn_options
from jaxpaged.server.vllm.flags import IGNORED_DEST, ignored_flag_warnings


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_a_vllm_launch_line_parses_into_settings_and_engine_options(tmp_path):
    config = tmp_path / "engine.yaml"
    config.write_text("max-num-seqs: 8\n")
    args = _args("org/model", "--served-model-name", "x", "y", "--enable-auto-tool-choice", "--tool-call-parser",
                 "llama3_json", "--reasoning-parser", "qwen3", "--config", str(config), "--max-model-len", "4096",
                 "--tokenizer", "org/other-tokenizer", "-tp", "1", "--trust-remote-code", "--disable-log-requests",
                 "--gpu-memory-utilization", "0.9", "--swap-space", "4")
    settings = settings_from_args(args)
    assert settings.served_model_names == ("x", "y") and settings.tool_call_parser == "llama3_json"
    assert settings.enable_auto_tool_choice and settings.reasoning_parser == "qwen3"
    assert engine_options_from_args(args, environ={}) == {"max_num_seqs": 8, "max_model_len": 4096,
                                                          "tokenizer": "org/other-tokenizer",
                                                          "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1}
    warnings = ignored_flag_warnings(getattr(args, IGNORED_DEST))
    assert [line.split(":")[0] for line in warnings] == ["--trust-remote-code", "--disable-log-requests",
                                                         "--swap-space"]


def test_gpu_memory_utilization_sizes_the_pool_up_to_that_share_of_the_device():
    from jaxpaged.config import EngineConfig
    from jaxpaged.runner.kv_cache import utilization_budget_bytes

    gib = 2**30
    assert utilization_budget_bytes(100 * gib, 2 * gib, 16 * gib, 0.9) == 72 * gib
    with pytest.raises(ValueError, match="^gpu_memory_utilization: 0.1 of"):
        utilization_budget_bytes(100 * gib, 2 * gib, 16 * gib, 0.1)
    with pytest.raises(ValueError, match="^gpu_memory_utilization: must be a number in"):
        EngineConfig.from_options(gpu_memory_utilization=1.5)


@pytest.mark.parametrize("argv", [["--enable-lora"], ["-pp", "2"]])
def test_vllm_flags_for_missing_features_are_refused_by_name(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _args("org/model", *argv)
    assert exit_info.value.code == 2
    flag = {"-pp": "--pipeline-parallel-size"}.get(argv[0], argv[0])
    assert f"{flag}: vLLM's flag for " in capsys.readouterr().err


def test_vllm_enable_expert_parallel_flag_is_an_engine_option():
    """vLLM's --enable-expert-parallel sets EngineConfig.enable_expert_parallel (off by default)."""
    from jaxpaged.config import EngineConfig

    options = engine_options_from_args(_args("org/model", "--enable-expert-parallel"), environ={})
    assert EngineConfig.from_options(**options).enable_expert_parallel is True
    default = engine_options_from_args(_args("org/model"), environ={})
    assert EngineConfig.from_options(**default).enable_expert_parallel is False
    with pytest.raises(ValueError, match="^enable_expert_parallel: must be a bool"):
        EngineConfig.from_options(enable_expert_parallel="yes")


@pytest.mark.parametrize("argv", [["--quantization", "int8"], ["-q", "tpu_int8"]])
def test_vllm_quantization_flag_selects_int8_weights(argv):
    """vLLM's --quantization / -q is an engine option; its tpu_int8 is jaxpaged's int8."""
    from jaxpaged.config import EngineConfig

    options = engine_options_from_args(_args("org/model", *argv), environ={})
    assert EngineConfig.from_options(**options).quantization == "int8"


@pytest.mark.parametrize("argv", [["--quantization", "awq"], ["-q", "gptq"]])
def test_an_unknown_quantization_scheme_is_refused_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _args("org/model", *argv)
    assert exit_info.value.code == 2
    assert "--quantization" in capsys.readouterr().err


def test_an_unknown_flag_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _args("org/model", "--no-such-vllm-flag")
    assert exit_info.value.code == 2
    assert "--no-such-vllm-flag" in capsys.readouterr().err


def test_chat_template_from_a_file_or_inline(tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages[0].content }}")
    assert settings_from_args(_args("--chat-template", str(template))).chat_template == "{{ messages[0].content }}"
    assert settings_from_args(_args("--chat-template", "{{ 1 }}")).chat_template == "{{ 1 }}"
    with pytest.raises(ValueError, match="^chat_template: --chat-template 'missing.jinja' is neither a file"):
        settings_from_args(_args("--chat-template", "missing.jinja"))


def test_cors_flags_take_vllm_json_lists():
    settings = settings_from_args(_args("--allowed-origins", '["https://a.example"]', "--allowed-methods",
                                        '["GET", "POST"]', "--allow-credentials"))
    assert settings.allowed_origins == ("https://a.example",) and settings.allowed_methods == ("GET", "POST")
    assert settings.allowed_headers == ("*",) and settings.allow_credentials
    assert settings_from_args(_args()).allowed_origins == ()
    with pytest.raises(ValueError, match="^allowed_origins: "):
        settings_from_args(_args("--allow-credentials"))
    with pytest.raises(SystemExit):
        _args("--allowed-origins", "*")  # not JSON


def test_tls_and_logging_flags_reach_uvicorn(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text("key")
    cert.write_text("cert")
    options = uvicorn_options(_args("--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--ssl-cert-reqs", "2",
                                    "--ssl-ca-certs", str(cert), "--root-path", "/llm", "--uvicorn-log-level",
                                    "warning", "--disable-uvicorn-access-log", "--port", "9000"))
    config = uvicorn.Config(lambda scope, receive, send: None, **options)
    assert (config.ssl_keyfile, config.ssl_certfile, config.ssl_cert_reqs) == (str(key), str(cert), 2)
    assert config.ssl_ca_certs == str(cert)
    # --log-level (jaxpaged's, INFO by default) is uvicorn's too unless --uvicorn-log-level says otherwise.
    assert _args().log_level == "info" and uvicorn_options(_args())["log_level"] == "info"
    assert uvicorn_options(_args("--log-level", "debug"))["log_level"] == "debug"
    assert (config.root_path, config.log_level, config.access_log, config.port) == ("/llm", "warning", False, 9000)
    with pytest.raises(ValueError, match="^ssl_certfile: --ssl-keyfile needs --ssl-certfile"):
        uvicorn_options(_args("--ssl-keyfile", str(key)))
    with pytest.raises(ValueError, match="^ssl_certfile: --ssl-certfile 'nope.pem' is not a file"):
        uvicorn_options(_args("--ssl-certfile", "nope.pem"))


def test_slow_client_limits_reach_uvicorn_and_the_settings():
    defaults = uvicorn.Config(lambda scope, receive, send: None, **uvicorn_options(_args()))
    assert (defaults.limit_concurrency, defaults.timeout_keep_alive) == (2048, 5)
    assert settings_from_args(_args()).request_body_timeout_s == 60.0
    args = _args("--limit-concurrency", "64", "--timeout-keep-alive", "2", "--request-body-timeout", "7.5")
    assert (uvicorn_options(args)["limit_concurrency"], uvicorn_options(args)["timeout_keep_alive"]) == (64, 2)
    assert settings_from_args(args).request_body_timeout_s == 7.5
    header_deadline = uvicorn_options(_args("--request-header-timeout", "3"))["http"]
    assert header_deadline.header_timeout_s == 3.0 and uvicorn_options(_args())["http"].header_timeout_s == 30.0
    with pytest.raises(ValueError, match="^limit_concurrency: --limit-concurrency must be >= 1"):
        uvicorn_options(_args("--limit-concurrency", "0"))
    with pytest.raises(ValueError, match="^request_body_timeout_s: must be a number of seconds > 0"):
        settings_from_args(_args("--request-body-timeout", "0"))


def test_engine_step_timeout_reaches_the_settings():
    assert settings_from_args(_args()).engine_step_timeout_s == 120.0
    assert settings_from_args(_args("--engine-step-timeout", "600")).engine_step_timeout_s == 600.0
    with pytest.raises(ValueError, match="^engine_step_timeout_s: must be a number of seconds > 0"):
        settings_from_args(_args("--engine-step-timeout", "0"))


def test_shutdown_timeouts_bound_the_drain_and_the_persist():
    assert uvicorn_options(_args())["timeout_graceful_shutdown"] == 30.0
    args = _args("--shutdown-timeout", "5", "--kv-persist-timeout", "90")
    assert uvicorn_options(args)["timeout_graceful_shutdown"] == 5.0 and args.kv_persist_timeout == 90.0
    with pytest.raises(ValueError, match="^shutdown_timeout: --shutdown-timeout must be >= 0"):
        uvicorn_options(_args("--shutdown-timeout", "-1"))


def test_max_prompts_per_request_flag_reaches_the_settings():
    assert settings_from_args(_args()).max_prompts_per_request == 1024
    assert settings_from_args(_args("--max-prompts-per-request", "8")).max_prompts_per_request == 8
    with pytest.raises(ValueError, match="^max_prompts_per_request: must be an int >= 1"):
        settings_from_args(_args("--max-prompts-per-request", "0"))


def test_enable_prompt_tokens_details_is_off_unless_given():
    assert not settings_from_args(_args()).enable_prompt_tokens_details
    assert settings_from_args(_args("--enable-prompt-tokens-details")).enable_prompt_tokens_details


def test_allowed_hosts_flag_takes_a_json_list():
    assert settings_from_args(_args()).allowed_hosts == ()
    hosts = settings_from_args(_args("--allowed-hosts", '["localhost", "*.example.com"]')).allowed_hosts
    assert hosts == ("localhost", "*.example.com")


def test_auto_tool_choice_needs_a_parser():
    with pytest.raises(ValueError, match="^enable_auto_tool_choice: --enable-auto-tool-choice needs "
                                         "--tool-call-parser"):
        ServerSettings(enable_auto_tool_choice=True)


def test_tokenizer_option_loads_another_tokenizer_offline(smollm2_tokenizer_dir):
    from jaxpaged.weights.tokenizer_source import load_tokenizer

    tokenizer = load_tokenizer("unused-model-dir", str(smollm2_tokenizer_dir))
    assert tokenizer.encode("Hello") and tokenizer.eos_token is not None
    with pytest.raises(ValueError, match="^tokenizer: cannot load 'no-org/no-such-tokenizer'"):
        load_tokenizer("unused-model-dir", "no-org/no-such-tokenizer")


def test_vllm_speculative_config_sets_the_speculative_options():
    args = _args("org/model", "--speculative-config",
                 '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}')
    options = engine_options_from_args(args, environ={})
    assert (options["speculative_method"], options["num_speculative_tokens"], options["prompt_lookup_max"]) == \
        ("ngram", 3, 5)
    config = EngineConfig.from_options(**options)
    assert (config.speculative.enabled, config.speculative.prompt_lookup_min) == (True, 2)


def test_vllm_speculative_config_names_a_draft_model():
    for argv in (["--speculative-config", '{"method": "draft_model", "model": "/d", "num_speculative_tokens": 2}'],
                 ["--speculative-model", "/d", "--num-speculative-tokens", "2"]):
        config = EngineConfig.from_options(**engine_options_from_args(_args("org/model", *argv), environ={}))
        assert (config.speculative.speculative_method, config.speculative.speculative_model,
                config.speculative.num_speculative_tokens) == ("draft_model", "/d", 2)


@pytest.mark.parametrize("text, message", [('{"method": "ngram", "draft": 1}', "unknown keys ['draft']"),
                                           ("[1]", "must be a JSON object"), ("{", "not JSON")])
def test_a_bad_speculative_config_is_refused_by_name(text, message, capsys):
    with pytest.raises(SystemExit):
        _args("org/model", "--speculative-config", text)
    assert f"--speculative-config: {message}" in capsys.readouterr().err

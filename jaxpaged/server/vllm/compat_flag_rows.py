"""docs/vllm-compatibility.md's command-line tables as data: one FlagRow per row, in the page's order.

Edit a row here, then run `python -m jaxpaged.server.vllm.compat_docs --write` (or `make docs`);
tests/server/test_flag_docs.py fails while the page and these rows differ, and server/compat_checks.py holds each row's
status to the serve parser (a "not yet" flag is refused, an "accepted no-op" one is warned about, the others parse).
"""

from jaxpaged.server.vllm.compat_rows import FlagRow

VLLM_FLAG_ROWS: tuple[FlagRow, ...] = (
    FlagRow(status="supported", flags=("--model",),
            label="`serve MODEL` (positional), `--model`",
            tests=("tests/engine/test_cli.py::test_serve_takes_the_model_as_vllm_does_positionally_or_by_flag",
                   "test_vllm_launch.py")),
    FlagRow(status="supported", flags=("--revision",),
            note="a branch, tag or commit of a Hub `--model`.",
            tests=("tests/weights/test_hub_resolution.py::test_revision_selects_another_snapshot",)),
    FlagRow(status="supported", flags=("--served-model-name",),
            label="`--served-model-name NAME [NAME ...]`",
            note="every name is accepted as `model`; `/v1/models` lists them; responses and the metrics' "
                 "`model_name` carry the first.",
            tests=("test_vllm_launch.py::test_models_lists_every_served_name_and_the_fitted_context",
                   "::test_a_request_may_name_any_served_name_and_the_response_names_the_first")),
    FlagRow(status="supported", flags=("--config",),
            label="`--config FILE.yaml`",
            note="every serve flag by its long name, dashes or underscores (`model`, `host`, `port`, "
                 "`served-model-name: [a, b]`, switches as `true`), and the engine options; flags on the command "
                 "line beat the file, the file beats `JAXPAGED_<OPTION>`; an unknown key is an error naming the "
                 "file and the key.",
            tests=("test_vllm_launch_flags.py::test_a_vllm_config_file_takes_serve_flags_and_the_command_line_wins",
                   "::test_an_unknown_key_in_the_config_file_is_named_with_the_file", "test_vllm_launch.py")),
    FlagRow(status="different", flags=("--max-model-len",),
            note="vLLM's human-readable sizes (`32k` = 32,000, `32K` = 32,768, `25.6k`) and `auto` / `-1` (the "
                 "default below), also in `--config` and `JAXPAGED_MAX_MODEL_LEN` "
                 "(`test_vllm_launch_flags.py::test_max_model_len_takes_sizes_and_auto`). Given: as vLLM (a pool "
                 "that cannot hold one sequence of it stops the start-up naming the options). Unset: the model's "
                 "`max_position_embeddings`, lowered, with a logged reason, when the KV pool cannot hold one "
                 "sequence of it (vLLM refuses to start instead).",
            tests=("tests/runner/test_max_model_len_default.py",
                   "test_vllm_launch.py::test_the_start_up_log_says_what_was_decided")),
    FlagRow(status="supported", flags=("--chat-template",),
            label="`--chat-template FILE_OR_TEMPLATE`",
            note="a file, or inline Jinja; rendered once at start-up, a failure stops it naming the flag.",
            tests=("test_serve_flags.py::test_chat_template_from_a_file_or_inline",
                   "test_vllm_requests.py::test_a_chat_template_that_fails_to_render_stops_the_start_up")),
    FlagRow(status="supported", flags=("--tokenizer",),
            note="a directory or a Hub id already in the HF cache (offline: nothing is downloaded).",
            tests=("test_serve_flags.py::test_tokenizer_option_loads_another_tokenizer_offline",)),
    FlagRow(status="different", flags=("--enable-auto-tool-choice", "--tool-call-parser"),
            label="`--enable-auto-tool-choice`, `--tool-call-parser NAME`",
            note="names: `hermes`, `llama3_json`, `pythonic`, `mistral`, `deepseek_v3`, `deepseek_v31`, `qwen3_xml` "
                 "/ `qwen3_coder` (Qwen3-Coder's `<function=...><parameter=...>` blocks, streamed per block; "
                 "without the schema a parameter whose text is JSON becomes that value), `xlam` (a JSON array of "
                 "calls, bare, fenced, after `[TOOL_CALLS]` or in `<tool_call>`), `openai` (gpt-oss's harmony "
                 "commentary messages addressed `to=functions.NAME`; `test_harmony.py`), `functiongemma` "
                 "(`<start_function_call>call:NAME{key:<escape>v<escape>}<end_function_call>`); vLLM's other names "
                 "are refused naming the flag. Streamed calls have vLLM's deltas (name first, then `arguments` "
                 "fragments); the JSON formats send the fragments as the model writes them, `functiongemma` one "
                 "argument at a time, `qwen3_xml` and `pythonic` each call's arguments whole when the call ends "
                 "(`test_streamed_tool_arguments.py`). "
                 'A parser alone already enables `tool_choice: "auto"` (vLLM also wants '
                 "`--enable-auto-tool-choice`, which is accepted and needs a parser). With `hermes` and "
                 '`llama3_json`, `"auto"` output is constrained to text or well-formed calls of the declared tools '
                 "(vLLM leaves it free; `test_auto_tool_grammar.py`); the other formats are parsed unconstrained, "
                 "as in vLLM, so a malformed call comes back as content.",
            tests=("test_tool_parsers.py",
                   "test_vllm_requests.py::test_auto_tool_calls_are_parsed_from_model_format_text",
                   "test_vllm_launch.py::test_llama3_json_tool_calls_are_parsed")),
    FlagRow(status="supported", flags=("--reasoning-parser",),
            label="`--reasoning-parser NAME`",
            note="`qwen3`, `deepseek_r1`, `mistral` (Magistral's `[THINK] ... [/THINK]`, special tokens kept in the "
                 "text; `test_reasoning_parsers.py::test_mistral_reads_think_brackets_whole_and_streamed`), "
                 "`openai_gptoss` (gpt-oss's harmony: the analysis channel is `reasoning`, final and preambles "
                 "`content`; a schema starts at the final channel's body; `test_harmony.py`) (vLLM's other names "
                 "are refused naming the flag); a model whose template and vocabulary lack `</think>` stops the "
                 "start-up naming the flag.",
            tests=("test_reasoning_parsers.py", "test_vllm_requests.py::test_reasoning_is_split_from_content")),
    FlagRow(status="different",
            flags=("--allowed-origins", "--allowed-methods", "--allowed-headers", "--allow-credentials"),
            label="`--allowed-origins`, `--allowed-methods`, `--allowed-headers` (JSON lists), `--allow-credentials`",
            note="the same flags and format, but no CORS headers unless `--allowed-origins` is given (vLLM allows "
                 'every origin by default; `--allowed-origins \'["*"]\'` restores that).',
            tests=("test_serve_flags.py::test_cors_flags_take_vllm_json_lists",
                   "test_vllm_requests.py::test_cors_answers_a_browser_preflight")),
    FlagRow(status="supported", flags=("--enable-prompt-tokens-details",),
            note="as in vLLM, `usage.prompt_tokens_details.cached_tokens` is returned only with the flag (a shared "
                 "prefix cache's hit count would show another client's prompt).",
            tests=("test_completions.py::test_prefix_cache_reported_in_usage",
                   "::test_cached_tokens_hidden_by_default")),
    FlagRow(status="supported", flags=("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs"),
            note="passed to uvicorn; a key without a certificate, or a path that is not a file, stops the start-up "
                 "naming the flag.",
            tests=("test_serve_flags.py::test_tls_and_logging_flags_reach_uvicorn",)),
    FlagRow(status="supported", flags=("--root-path", "--uvicorn-log-level", "--disable-uvicorn-access-log"),
            tests=("test_serve_flags.py::test_tls_and_logging_flags_reach_uvicorn",)),
    FlagRow(status="different", flags=("--kv-events-config",),
            label="`--kv-events-config JSON`",
            note="`enable_kv_cache_events`, `publisher` (`zmq`, `null`), `endpoint` (default: port 5557 on the HTTP "
                 "`--host`, not `tcp://*:5557`), `topic`, `hwm` (bounded in bytes); jaxpaged's CURVE keys, `redact` "
                 "and byte bounds ([server.md](server.md#kv-cache-events-what-a-subscriber-sees)); vLLM's wire "
                 'format (events as maps; `"event_layout": "array"` for older subscribers); device pool (`"GPU"`) '
                 'and KV tiers (`"CPU"`, `"DISK"`), no replay socket, one socket for every data-parallel rank '
                 "([features.md](features.md#kv-cache-events)).",
            tests=("tests/engine/test_kv_events.py", "tests/engine/test_kv_tier_events.py",
                   "tests/engine/test_kv_events_access.py", "tests/engine/test_kv_events_bounds.py")),
    FlagRow(status="supported", flags=("--host", "--port", "--api-key"),
            label="`--host`, `--port`, `--api-key KEY [KEY ...]`",
            note="several keys: any of them is accepted; without the flag `JAXPAGED_API_KEY`, else vLLM's "
                 "`VLLM_API_KEY` (both set and different: `JAXPAGED_API_KEY` wins, with a warning). The start-up "
                 "line says when `--host` is loopback only (jaxpaged's default is `127.0.0.1`; vLLM's is every "
                 "address).",
            tests=("test_auth.py", "test_vllm_launch_flags.py::test_several_api_keys_are_each_accepted",
                   "::test_vllm_api_key_is_read_and_jaxpaged_s_own_variable_wins",
                   "::test_the_start_up_line_says_when_only_loopback_is_bound", "test_vllm_launch.py")),
    FlagRow(status="supported", flags=("--dtype",),
            note="vLLM's `half` and `float` are `float16` and `float32`.",
            tests=("test_vllm_launch_flags.py::test_vllm_dtype_names_are_accepted",)),
    FlagRow(status="supported", flags=("--kv-cache-memory-bytes",),
            label="`--kv-cache-memory-bytes SIZE`",
            note="the KV pool per device (`--kv-cache-memory`, per device too), in vLLM's human-readable form (`8G` "
                 "= 8 GiB, `8g` = 8e9).",
            tests=("test_vllm_launch_flags.py::test_kv_cache_memory_bytes_is_the_pool_per_device",)),
    FlagRow(status="supported", flags=("--disable-hybrid-kv-cache-manager",),
            note="every layer keeps every token in one KV cache group; without it, sliding-window layers keep only "
                 "their window ([kv-cache-groups.md](kv-cache-groups.md)). Also the `LLM(...)` key.",
            tests=("test_hybrid_kv_flag.py::test_the_vllm_flag_and_llm_key_set_the_config_field",)),
    FlagRow(status="accepted no-op", flags=("--enable-chunked-prefill", "--no-enable-chunked-prefill"),
            note="accepted, logged once: jaxpaged always chunks long prefills (`--max-num-batched-tokens` bounds a "
                 "step) and cannot turn it off.",
            tests=("test_vllm_launch_flags.py::test_no_op_flags_are_accepted_and_logged_once",)),
    FlagRow(status="different", flags=("--generation-config", "--override-generation-config"),
            label="`--generation-config auto`, `--override-generation-config JSON`",
            note="`auto` is what jaxpaged always does (the model's `generation_config.json` sets the sampling "
                 "defaults); `vllm` or a folder is refused naming the flag. The override replaces `temperature`, "
                 "`top_p`, `top_k`, `min_p`, `repetition_penalty` defaults; another key stops the start-up naming "
                 "it.",
            tests=("test_vllm_launch_flags.py::test_unsupported_vllm_values_are_named_with_what_is_supported",
                   "::test_override_generation_config_overrides_the_models_defaults")),
    FlagRow(status="supported", flags=("--default-chat-template-kwargs",),
            label="`--default-chat-template-kwargs JSON`",
            note="every chat request's `chat_template_kwargs` start from it; the request's own keys win.",
            tests=("test_vllm_launch_flags.py::test_default_chat_template_kwargs_sit_under_the_requests_own",)),
    FlagRow(status="supported", flags=("--download-dir", "--hf-token"),
            label="`--download-dir`, `--hf-token [TOKEN]`",
            note="the Hugging Face cache directory and token of a Hub `--model`'s download; `--hf-token` alone: the "
                 "token `hf auth login` stored.",
            tests=("test_vllm_download_flags.py::test_download_dir_and_hf_token_reach_hugging_face",
                   "::test_hf_token_without_a_value_keeps_the_stored_token")),
    FlagRow(status="different", flags=("--structured-outputs-config",),
            label="`--structured-outputs-config JSON`",
            note="`enable_in_reasoning` is honoured (a grammar holds inside the reasoning too); its other keys are "
                 "logged once: one structured-output backend here (its own grammar compiler).",
            tests=("test_vllm_launch_flags.py::test_structured_outputs_config_enable_in_reasoning_reaches_the_settings",
                   "::test_no_op_flags_are_accepted_and_logged_once")),
    FlagRow(status="accepted no-op", flags=("--max-logprobs",),
            note="logged once: logprobs are capped at 20 per token (the OpenAI limit) whatever the flag says.",
            tests=("test_vllm_launch_flags.py::test_no_op_flags_are_accepted_and_logged_once",)),
    FlagRow(status="supported", flags=("--disable-log-stats",),
            note="without it, every 10 s: `Avg prompt throughput`, `Avg generation throughput` (tokens/s over the "
                 "interval), `Running`, `Waiting`, `KV cache usage`, `Prefix cache hit rate` (over the interval); "
                 "an idle engine logs one idle line, not one per interval.",
            tests=("test_stats_log.py",)),
    FlagRow(status="supported", flags=("--enable-log-requests",),
            note="one line per engine request: its id, prompt length in tokens and sampling parameters (never the "
                 "prompt text or the API key).",
            tests=("test_stats_log.py::test_a_request_log_line_names_the_request_its_prompt_length_and_its_params",
                   "test_vllm_launch.py::test_the_request_log_has_one_line_per_request")),
    FlagRow(status="supported", flags=("--max-num-queued-reqs",),
            note="the same as `--max-queued-requests`: off by default (a benchmark's burst queues, as in vLLM); "
                 "set, a 429 with `Retry-After` past it.",
            tests=("test_vllm_launch_flags.py::test_the_queue_limit_is_opt_in_with_vllm_s_alias", "test_overload.py")),
    FlagRow(status="supported",
            flags=("--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--seed",
                   "--enable-prefix-caching", "--no-enable-prefix-caching", "-tp", "--tensor-parallel-size", "-dp",
                   "--data-parallel-size", "--enable-expert-parallel", "--async-scheduling", "--scheduling-policy",
                   "--long-prefill-token-threshold"),
            label="`--max-num-seqs`, `--max-num-batched-tokens`, `--block-size`, `--seed`, "
                  "`--enable-prefix-caching` / `--no-enable-prefix-caching`, `-tp` / `--tensor-parallel-size`, "
                  "`-dp` / `--data-parallel-size`, `--enable-expert-parallel`, `--async-scheduling`, "
                  "`--scheduling-policy`, `--long-prefill-token-threshold`",
            note="generated from `EngineConfig` under vLLM's names (`--dtype`: its own row above).",
            tests=("tests/engine/test_cli_options.py::test_vllm_engine_flags_keep_vllm_spellings",
                   "::test_the_flags_the_readme_and_tests_use_keep_working")),
    FlagRow(status="different", flags=("--speculative-config",),
            label="`--speculative-config JSON`",
            note="`method` `ngram` (vLLM's prompt lookup) or `draft_model` with `model` (given alone, `model` "
                 "implies `draft_model`, as vLLM infers it), with `num_speculative_tokens`, `prompt_lookup_min`, "
                 "`prompt_lookup_max`, `disable_by_batch_size`; it sets the `--speculative-*` engine options. "
                 "Another method (EAGLE, MTP ...) is refused naming `speculative_method`, an unknown key (vLLM's "
                 "`draft_tensor_parallel_size`, ...) naming the flag and the key.",
            tests=("test_serve_flags.py::test_vllm_speculative_config_sets_the_speculative_options",
                   "::test_vllm_speculative_config_names_a_draft_model",
                   "::test_a_bad_speculative_config_is_refused_by_name")),
    FlagRow(status="different", flags=(),
            label="multi-node serving",
            note="every host runs the same `jaxpaged serve` line with `--coordinator-address`, `--num-processes` "
                 "and `--process-id` (or `--distributed` on a TPU pod slice; [multihost.md](multihost.md)); no Ray "
                 "cluster. `--distributed-executor-backend` is accepted and ignored (below); vLLM's data-parallel "
                 "node flags (`--headless`, `--data-parallel-address`, `--data-parallel-rpc-port`, ...) are "
                 "unrecognized, named by argparse.",
            tests=("tests/parallel/test_multihost_options.py",)),
    FlagRow(status="accepted no-op", flags=("--trust-remote-code", "--disable-log-requests", "--enforce-eager",
                   "--disable-frontend-multiprocessing", "--disable-custom-all-reduce", "--swap-space",
                   "--max-log-len", "--load-format", "--distributed-executor-backend"),
            note="accepted, one warning each at start-up saying why it changes nothing here.",
            tests=("test_serve_flags.py::test_a_vllm_launch_line_parses_into_settings_and_engine_options",
                   "test_vllm_launch.py::test_the_start_up_log_says_what_was_decided")),
    FlagRow(status="different", flags=("--gpu-memory-utilization",),
            note="on an accelerator the KV pool fills each device up to that share of its memory, after the weights "
                 "and the buffers in use (vLLM also profiles the activations' peak; here XLA's step buffers come "
                 "out of the rest); not used on a CPU (1 GiB default) or with `--kv-cache-memory` / "
                 "`--num-kv-blocks`.",
            tests=("test_serve_flags.py::test_gpu_memory_utilization_sizes_the_pool_up_to_that_share_of_the_device",)),
    FlagRow(status="different", flags=("--quantization",),
            label="`--quantization` / `-q`",
            note="`int8` (vLLM's `tpu_int8` is accepted as the same): weight-only int8 of the attention and MLP "
                 "projections, quantized while a float checkpoint loads; `w8a8` (SGLang's `w8a8_int8`; no vLLM "
                 "flag: vLLM runs it from compressed-tensors checkpoints): dynamic per-token int8 activations too; "
                 "`compressed-tensors`: int8 W8A16 / W8A8 checkpoints as vLLM reads them (channel, tensor or group "
                 "scales; a checkpoint's config is read without the flag too, as vLLM does). AWQ, GPTQ, fp8 and "
                 "int4 checkpoints are refused naming the field.",
            tests=("test_serve_flags.py::test_vllm_quantization_flag_selects_int8_weights",
                   "tests/models/test_int8_engine.py", "tests/models/test_w8a8.py",
                   "tests/weights/test_compressed_tensors.py")),
    FlagRow(status="different", flags=("--kv-cache-dtype",),
            note="`auto` (the model dtype), `int8`, `fp8` / `fp8_e4m3`: 8-bit codes with one bfloat16 scale per "
                 "token per KV head, written with the token (vLLM's fp8 keeps one scale per tensor, 1.0 without "
                 "calibration); `fp8_e5m2` and vLLM's other values are refused at parse time naming the option and "
                 "the supported values (`-q awq` likewise; "
                 "`test_vllm_launch_flags.py::test_unsupported_vllm_values_are_named_with_what_is_supported`); "
                 "every attention backend reads both formats (`pallas_tpu` in a TPU layout of its own, the packed "
                 "quantized one) ([features](features.md#kv-cache-quantization)).",
            tests=("tests/engine/test_kv_cache_dtype.py", "tests/models/test_quantized_kv_engine.py",
                   "tests/engine/test_tpu_quantized_kv_engine.py")),
    FlagRow(status="supported",
            flags=("--enable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras", "--lora-modules"),
            label="`--enable-lora`, `--max-loras`, `--max-lora-rank`, `--max-cpu-loras`, `--lora-modules` "
                  "(`name=path` or the JSON form)",
            note="PEFT LoRA adapters on the attention and MLP projections, mixed in one compiled step "
                 "([LoRA](lora.md)).",
            tests=("test_serve_flags.py::test_vllm_lora_flags_reach_the_engine_and_the_settings", "tests/lora/")),
    FlagRow(status="not yet", flags=("--pipeline-parallel-size", "-pp", "--kv-transfer-config", "--cpu-offload-gb",
                   "--limit-mm-per-prompt"),
            label="`--pipeline-parallel-size` / `-pp`, `--kv-transfer-config`, `--cpu-offload-gb`, "
                  "`--limit-mm-per-prompt`",
            note="refused at parse time naming the flag and the missing feature.",
            tests=("test_serve_flags.py::test_vllm_flags_for_missing_features_are_refused_by_name",)),
    FlagRow(status="not yet", flags=(),
            label="any other vLLM flag",
            note='argparse\'s "unrecognized arguments", which names it.',
            tests=("test_serve_flags.py::test_an_unknown_flag_is_named",)),
)
"""vLLM's serve flags: what each does on `jaxpaged serve`."""

JAXPAGED_FLAG_ROWS: tuple[FlagRow, ...] = (
    FlagRow(status="jaxpaged only", flags=("--log-level",),
            note="jaxpaged's loggers (start-up plan, dtype, memory plan), INFO by default, and uvicorn's unless "
                 "`--uvicorn-log-level` is given; vLLM reads `VLLM_LOGGING_LEVEL` instead, which is not read here.",
            tests=("tests/engine/test_cli.py::test_serve_sets_jaxpaged_logging_before_anything_else",
                   "tests/engine/test_logging_setup.py")),
    FlagRow(status="jaxpaged only", flags=("--allowed-hosts",),
            label="`--allowed-hosts JSON`",
            note="the `Host` header must match one of the patterns (against DNS rebinding of a keyless local "
                 "server); unset: any host.",
            tests=("test_serve_flags.py::test_allowed_hosts_flag_takes_a_json_list",
                   "test_http_guards.py::test_a_host_outside_allowed_hosts_is_refused")),
    FlagRow(status="jaxpaged only",
            flags=("--max-prompts-per-request", "--max-n", "--max-queued-requests", "--max-request-body-bytes"),
            note="a 400, 400, 429 or 413 past the bound (`--max-queued-requests`: no bound unless given).",
            tests=("test_serve_flags.py::test_max_prompts_per_request_flag_reaches_the_settings",
                   "test_request_keys.py::test_n_over_the_servers_max_n_is_a_400_naming_n",
                   "test_overload.py::test_429_when_queue_would_overflow",
                   "test_bad_input.py (`prompts-over-cap`, `n-over-max-n`, `body-over-2MiB`)")),
    FlagRow(status="jaxpaged only",
            flags=("--request-body-timeout", "--request-header-timeout", "--limit-concurrency", "--timeout-keep-alive",
                   "--shutdown-timeout", "--kv-persist-timeout", "--engine-step-timeout"),
            note="slow clients, drain and a stalled engine.",
            tests=("test_serve_flags.py::test_slow_client_limits_reach_uvicorn_and_the_settings",
                   "::test_shutdown_timeouts_bound_the_drain_and_the_persist",
                   "::test_engine_step_timeout_reaches_the_settings")),
    FlagRow(status="jaxpaged only",
            flags=("--num-kv-blocks", "--kv-cache-memory", "--prefix-caching-granularity", "--speculative-method",
                   "--attention-backend", "--cpu-matmul", "--cpu-attention", "--compilation-cache-dir",
                   "--advisor-log-text"),
            label="`--num-kv-blocks`, `--kv-cache-memory`, `--kv-offload-*`, `--prefix-caching-granularity`, "
                  "`--speculative-method` and the other `--speculative-*`, `--attention-backend`, `--cpu-matmul`, "
                  "`--cpu-attention`, `--compilation-cache-dir`, `--advisor-log-text`",
            note="engine options, generated from `EngineConfig`.",
            tests=("tests/engine/test_cli_options.py::test_every_config_field_has_a_documented_flag",)),
)
"""Flags vLLM does not have (the server's limits; the engine options are in docs/configuration.md)."""

"""docs/vllm-compatibility.md's request-key table as data: one KeyRow per row, in the page's order.

Edit a row here, then run `python -m jaxpaged.server.vllm.compat_docs --write` (or `make docs`); server/compat_checks.py
holds each row's status to the request validator (a "not yet" key is a 400 naming it, a supported one is read).
"""

from jaxpaged.server.vllm.compat_rows import KeyRow

KEY_ROWS: tuple[KeyRow, ...] = (
    KeyRow(status="supported",
           keys=("n", "temperature", "top_p", "stop", "max_tokens", "chat:max_completion_tokens", "logprobs",
                 "chat:top_logprobs", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "stream",
                 "stream_options.include_usage", "response_format", "chat:tools", "chat:tool_choice",
                 "completions:echo"),
           label="OpenAI's completions and chat keys (`n`, `temperature`, `top_p`, `stop`, `max_tokens` / "
                 "`max_completion_tokens`, `logprobs`, `top_logprobs`, `seed`, penalties (`presence_penalty`, "
                 "`frequency_penalty`), `logit_bias`, `stream`, `stream_options.include_usage`, `response_format`, "
                 "`tools`, `tool_choice`, `echo`)",
           note="the sampling keys reach the engine as given "
                "(`test_request_keys.py::test_sampling_keys_reach_the_sampling_params_on_both_endpoints`); the "
                "endpoints:",
           tests=("test_completions.py", "test_chat.py", "test_tool_calls.py", "test_structured_outputs_api.py",
                  "test_echo_logprobs.py")),
    KeyRow(status="supported",
           keys=("top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
                 "include_stop_str_in_output", "skip_special_tokens", "cache_salt", "priority",
                 "chat:add_generation_prompt"),
           note="each reaches the engine as given (`test_request_keys.py`); their effect:",
           tests=("tests/sampling/test_sampler.py", "test_completions.py::test_stop_token_ids_and_min_tokens",
                  "test_multibyte_text.py", "tests/core/test_scheduler_preemption.py (priority)",
                  "test_vllm_requests.py::test_continue_final_message_ends_the_prompt_inside_the_last_message "
                  "(`add_generation_prompt`)")),
    KeyRow(status="supported",
           keys=("structured_outputs", "structured_outputs.json", "structured_outputs.regex",
                 "structured_outputs.choice", "structured_outputs.grammar", "structured_outputs.json_object"),
           label="`structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`)",
           note="both endpoints; one constraint per request (with `response_format` / `guided_*` too), else a 400 "
                "naming it.",
           tests=("test_vllm_requests.py::test_structured_outputs_constrain_chat_and_completions",
                  "::test_bad_or_unhonoured_vllm_keys_are_refused_by_name")),
    KeyRow(status="not yet",
           keys=("structured_outputs.structural_tag", "structured_outputs.whitespace_pattern",
                 "structured_outputs.disable_any_whitespace", "structured_outputs.disable_fallback",
                 "structured_outputs.disable_additional_properties"),
           label="`structured_outputs.structural_tag`, `.whitespace_pattern`, `.disable_any_whitespace`, "
                 "`.disable_fallback`, `.disable_additional_properties`",
           note="400 naming `structured_outputs.<key>` (the `disable_*` keys pass at `false`).",
           tests=("test_vllm_requests.py::test_bad_or_unhonoured_vllm_keys_are_refused_by_name",)),
    KeyRow(status="supported", keys=("guided_json", "guided_regex", "guided_choice", "guided_grammar"),
           label="`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (vLLM < 0.12)",
           tests=("test_structured_outputs_api.py::test_guided_choice_and_regex_on_completions",
                  "test_request_keys.py::test_vllm_guided_keys_are_the_structured_output_of_the_same_kind")),
    KeyRow(status="supported", keys=("chat:chat_template_kwargs",),
           note="extra template variables (`enable_thinking: false` reaches the template); not an object, or a name "
                "the renderer owns (`tokenize`, `tools`, ...): 400 naming it.",
           tests=("test_vllm_requests.py::test_enable_thinking_false_reaches_the_template",
                  "::test_bad_or_unhonoured_vllm_keys_are_refused_by_name")),
    KeyRow(status="supported", keys=("chat:continue_final_message",),
           note="with `add_generation_prompt: false`; both true is a 400.",
           tests=("test_vllm_requests.py::test_continue_final_message_ends_the_prompt_inside_the_last_message",
                  "::test_bad_or_unhonoured_vllm_keys_are_refused_by_name")),
    KeyRow(status="supported", keys=("truncate_prompt_tokens",),
           note="both endpoints: the prompt's last k tokens run (left truncation, as vLLM); `-1`: the last "
                "`max_model_len`; anything but an int >= 1 or -1 is a 400 naming it.",
           tests=("test_prompt_truncation.py",)),
    KeyRow(status="supported", keys=("return_tokens_as_token_ids",),
           label="`return_tokens_as_token_ids`, `--return-tokens-as-token-ids`",
           note="logprobs spell tokens `token_id:<id>`; the request's value wins over the flag.",
           tests=("test_vllm_request_keys_honoured.py::"
                  "test_return_tokens_as_token_ids_spells_each_logprob_token_by_its_id",)),
    KeyRow(status="supported", keys=("chat:parallel_tool_calls",),
           note='`false`: at most one call per choice (the first; a `"required"` grammar holds one).',
           tests=("test_tool_choice_options.py::"
                  "test_parallel_tool_calls_false_keeps_the_first_auto_call_whole_and_streamed",
                  "::test_required_with_parallel_tool_calls_false_holds_one_call_in_its_grammar")),
    KeyRow(status="supported", keys=("chat:tool_choice",),
           label='`tool_choice: "none"` with tools',
           note="the answer is text and the tools stay in the prompt, as in vLLM; "
                "`--exclude-tools-when-tool-choice-none` leaves them out.",
           tests=("test_tool_choice_options.py::test_tool_choice_none_keeps_the_tools_in_the_prompt_unless_excluded",)),
    KeyRow(status="supported",
           label="structured outputs with `--reasoning-parser`",
           note="as vLLM: a schema, regex, choice or grammar holds after the reasoning ends (`</think>`), so a "
                "thinking model thinks first; from the first token when the prompt closed the reasoning (thinking "
                'switched off) and for tool calls. Offline: `StructuredOutputsParams(starts_after="</think>")`.',
           tests=("tests/sampling/test_request_grammar.py::"
                  "test_a_grammar_that_starts_after_a_marker_leaves_the_text_before_it_free",
                  "test_reasoning_field.py::test_a_schema_waits_for_the_reasoning_to_end_unless_the_prompt_closed_it")),
    KeyRow(status="supported", keys=("chat:reasoning_effort",),
           note="reaches the chat template as `reasoning_effort` (gpt-oss's template reads it; a "
                "`chat_template_kwargs` value wins).",
           tests=("test_tool_choice_options.py::"
                  "test_reasoning_effort_reaches_the_chat_template_unless_the_request_sets_it",)),
    KeyRow(status="supported", keys=("chat:include_reasoning",),
           note="chat: `false` leaves `reasoning` out.",
           tests=("test_reasoning_field.py::test_include_reasoning_false_drops_the_reasoning_and_keeps_the_content",)),
    KeyRow(status="supported", keys=("stream_options.continuous_usage_stats",),
           note="every chunk carries its choice's usage so far.",
           tests=("test_vllm_requests.py::test_continuous_usage_stats_count_each_choice_so_far",)),
    KeyRow(status="supported", keys=("return_token_ids",),
           note="completions: each choice carries `prompt_token_ids` and `token_ids`; chat: `prompt_token_ids` on "
                "the response, `token_ids` per choice; streamed: the prompt ids on a choice's (chat: the stream's) "
                "first chunk, each chunk the ids it adds.",
           tests=("test_vllm_request_keys_honoured.py::test_return_token_ids_on_completions_whole_and_streamed",
                  "::test_return_token_ids_on_chat_whole_and_streamed")),
    KeyRow(status="supported", keys=("request_id",),
           note="the response id is `cmpl-<request_id>` / `chatcmpl-<request_id>`, whole and streamed; the engine's "
                "own id stays unique, so two clients may send the same one (1..256 characters, else a 400).",
           tests=("test_vllm_request_keys_honoured.py::"
                  "test_request_id_names_the_response_and_two_clients_may_share_it",)),
    KeyRow(status="supported", keys=("allowed_token_ids", "bad_words"),
           note="a -inf mask in the sampler's dense bias row: every id outside `allowed_token_ids`; a bad word's "
                "last token right after its other tokens (the word tokenized bare and after a space, as vLLM; "
                "output tokens only). Ids outside the vocabulary: a 400 naming the field.",
           tests=("test_vllm_request_keys_honoured.py::test_allowed_token_ids_restrict_every_sampled_token",
                  "::test_bad_words_are_never_generated", "::test_banned_bad_word_ids_follow_vllms_rule")),
    KeyRow(status="supported", keys=("prompt_logprobs",),
           label="`prompt_logprobs` (0..20)",
           note="completions: per choice; chat: on the response; `None` for the first token, then `{token id: "
                "{logprob, rank, decoded_token}}` for the token and its k most likely. With `stream: true` a 400, "
                "as vLLM.",
           tests=("test_vllm_request_keys_honoured.py::test_prompt_logprobs_on_completions_match_the_echoed_prompts",
                  "::test_prompt_logprobs_on_chat_and_refused_when_streaming")),
    KeyRow(status="not yet",
           keys=("use_beam_search", "length_penalty", "guided_decoding_backend", "guided_whitespace_pattern",
                 "logits_processors", "kv_transfer_params", "vllm_xargs", "spaces_between_special_tokens",
                 "repetition_detection", "thinking_token_budget", "chat:chat_template", "chat:documents",
                 "chat:mm_processor_kwargs", "chat:media_io_kwargs", "chat:echo", "chat:add_special_tokens",
                 "completions:prompt_embeds", "completions:add_special_tokens"),
           label="`use_beam_search`, `length_penalty`, `guided_decoding_backend`, `guided_whitespace_pattern`, "
                 "`logits_processors`, `kv_transfer_params`, `vllm_xargs`, `spaces_between_special_tokens: false`, "
                 "`repetition_detection`, `thinking_token_budget`; chat: `chat_template`, `documents`, "
                 "`mm_processor_kwargs`, `media_io_kwargs`, `echo`, `add_special_tokens: true`; completions: "
                 "`prompt_embeds`, `add_special_tokens: false`",
           note="400 naming the key.",
           tests=("test_vllm_requests.py::test_bad_or_unhonoured_vllm_keys_are_refused_by_name",
                  "::test_vllm_keys_at_their_off_values_pass")),
    KeyRow(status="supported",
           label="`reasoning` in chat messages and stream deltas",
           note="with `--reasoning-parser`, under vLLM's current name (vLLM renamed `reasoning_content` to "
                "`reasoning`, vllm#27752, and removed the old name from responses, vllm#33402: neither returns it). "
                "`include_reasoning: false` leaves it out.",
           tests=("test_reasoning_field.py", "test_vllm_requests.py::test_reasoning_is_split_from_content")),
    KeyRow(status="supported", keys=("chat:messages.reasoning", "chat:messages.reasoning_content"),
           label="`reasoning` / `reasoning_content` on input assistant messages",
           note="either name reaches the chat template under both names (`reasoning` wins when both are given).",
           tests=("test_reasoning_field.py::"
                  "test_an_assistant_message_s_reasoning_reaches_the_template_under_both_names",)),
)
"""vLLM's and OpenAI's request keys: what each does on `jaxpaged serve`."""

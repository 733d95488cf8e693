"""The server's pure pieces, without an engine: error messages, stream deltas, logprob formatting, settings."""

import pytest

from jaxpaged.outputs import CompletionOutput, Logprob
from jaxpaged.server.context import ServerSettings
from jaxpaged.server.http.errors import APIError, from_validation_errors, from_value_error, sanitize_message
from jaxpaged.server.openai.prompts import MAX_SHOWN_KEY_CHARS, ChatRendering
from jaxpaged.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from jaxpaged.server.openai.responses import SampleProgress, chat_logprobs, completion_logprobs, usage
from jaxpaged.server.openai.validation import parse_model, resolve_max_tokens


class _Tokenizer:
    """decode([id]) -> "<id>"; enough for formatting tests."""

    def decode(self, token_ids):
        return "".join(f"<{token_id}>" for token_id in token_ids)


def _sample(text, token_ids, finish_reason=None, logprobs=None) -> CompletionOutput:
    return CompletionOutput(index=0, text=text, token_ids=token_ids, cumulative_logprob=None, logprobs=logprobs,
                            finish_reason=finish_reason)


def test_value_error_message_loses_the_echoed_value():
    """"field: rule, got <value>" keeps the field and the rule, never the value."""
    error = from_value_error(ValueError("min_tokens: must be <= max_tokens (2), got '<script>'"))
    assert error.status_code == 400 and error.param == "min_tokens"
    assert error.message == "min_tokens: must be <= max_tokens (2)"
    assert sanitize_message("x" * 1000).endswith("...") and len(sanitize_message("x" * 1000)) < 400
    assert from_value_error(ValueError("no field here")).param is None


def test_validation_error_names_nested_field_without_input():
    """Pydantic's first error becomes "messages[0].role: ..." with no trace of the input."""
    with pytest.raises(APIError) as caught:
        parse_model(ChatCompletionRequest, {"messages": [{"role": "wizard-SECRET", "content": "x"}]})
    error = caught.value
    assert error.status_code == 400 and error.param == "messages[0].role"
    assert "SECRET" not in error.message
    assert from_validation_errors([]).status_code == 400


def test_strict_schema():
    """No coercion: "5" is not an int, 1 is not a bool; unknown fields are ignored."""
    for bad in ({"prompt": "x", "max_tokens": "5"}, {"prompt": "x", "echo": 1}, {"prompt": "x", "n": 1.0}):
        with pytest.raises(APIError):
            parse_model(CompletionRequest, bad)
    assert parse_model(CompletionRequest, {"prompt": "x", "user": "u", "temperature": 1}).temperature == 1.0


@pytest.mark.parametrize("num_prompt, requested, default, expected", [
    (10, None, 16, 16), (500, None, 16, 12), (511, None, None, 1), (10, 502, None, 502), (1, 511, 16, 511)])
def test_resolve_max_tokens_fits(num_prompt, requested, default, expected):
    """Unset: the default clipped to the room left; set: taken as is when prompt + it fits max_model_len=512."""
    assert resolve_max_tokens(requested, default, num_prompt, 512) == expected


@pytest.mark.parametrize("num_prompt, requested", [(512, None), (600, 1), (10, 503), (0, 1)])
def test_resolve_max_tokens_rejects(num_prompt, requested):
    """No room, a prompt over the limit, prompt + max_tokens over it, or an empty prompt: 400."""
    with pytest.raises(APIError) as caught:
        resolve_max_tokens(requested, 16, num_prompt, 512)
    assert caught.value.status_code == 400


def test_sample_progress_sends_differences():
    """Deltas of cumulative outputs: held-back text waits, tokens are counted once, the finish is sent once."""
    progress = SampleProgress()
    first = progress.advance(_sample("Hel", [1]), with_logprobs=False)
    assert first is not None
    assert (first.text, first.start_token, first.end_token, first.finish_reason) == ("Hel", 0, 1, None)
    assert progress.advance(_sample("Hel", [1, 2]), with_logprobs=False) is None  # text held back
    second = progress.advance(_sample("Hello", [1, 2, 3]), with_logprobs=False)
    assert second is not None
    assert (second.text, second.start_token, second.end_token) == ("lo", 1, 3)
    last = progress.advance(_sample("Hello", [1, 2, 3, 4], "stop"), with_logprobs=False)
    assert last is not None
    assert (last.text, last.finish_reason) == ("", "stop")
    assert progress.advance(_sample("Hello", [1, 2, 3, 4], "stop"), with_logprobs=False) is None


def test_sample_progress_with_logprobs_sends_token_only_steps():
    """With logprobs, a step that added tokens but no text still gets a chunk (for its logprobs)."""
    progress = SampleProgress()
    progress.advance(_sample("a", [1]), with_logprobs=True)
    delta = progress.advance(_sample("a", [1, 2]), with_logprobs=True)
    assert delta is not None and delta.text == "" and (delta.start_token, delta.end_token) == (1, 2)


def test_logprob_formatting_ranks_and_floors():
    """Top alternatives by rank, limited to num_top; a sampled token outside them keeps its own logprob;
    -inf becomes the finite floor -9999."""
    entries = [{7: Logprob(-0.1, 1), 8: Logprob(-2.0, 2), 9: Logprob(float("-inf"), 3)},
               {5: Logprob(-0.5, 1), 6: Logprob(-1.5, 2), 4: Logprob(-3.0, 3)}]
    sample = _sample("<7><4>", [7, 4], "length", entries)
    legacy, offset = completion_logprobs(_Tokenizer(), sample, 0, 2, 2, 10)
    assert legacy["tokens"] == ["<7>", "<4>"]
    assert legacy["token_logprobs"] == [-0.1, -3.0]
    assert legacy["top_logprobs"] == [{"<7>": -0.1, "<8>": -2.0}, {"<5>": -0.5, "<6>": -1.5}]
    assert legacy["text_offset"] == [10, 13] and offset == 16
    chat = chat_logprobs(_Tokenizer(), sample, 1, 2, 3)["content"]
    assert [alt["token"] for alt in chat[0]["top_logprobs"]] == ["<5>", "<6>", "<4>"]
    assert chat[0]["bytes"] == list(b"<4>")
    floored = chat_logprobs(_Tokenizer(), sample, 0, 1, 3)["content"][0]["top_logprobs"][2]
    assert floored["logprob"] == -9999.0


def test_usage_counts_each_prompt_once():
    """prompt_tokens per prompt (not per choice), completion_tokens over every choice, cached tokens summed."""
    from jaxpaged.outputs import RequestMetrics, RequestOutput

    def output(num_prompt, num_cached, lens):
        samples = [_sample("", list(range(n))) for n in lens]
        return RequestOutput("r", None, list(range(num_prompt)), num_cached, samples, True, RequestMetrics(0.0))

    finals = [output(10, 0, [3, 4]), output(5, 2, [1])]
    assert usage(finals, with_cached_tokens=True) == {
        "prompt_tokens": 15, "completion_tokens": 8, "total_tokens": 23,
        "prompt_tokens_details": {"cached_tokens": 2}}
    assert usage(finals) == {"prompt_tokens": 15, "completion_tokens": 8, "total_tokens": 23}


def test_server_settings_validate():
    """Bad limits raise ValueError naming the field; an empty key is refused without echoing it."""
    with pytest.raises(ValueError, match="max_n"):
        ServerSettings(max_n=0)
    with pytest.raises(ValueError, match="max_queued_requests"):
        ServerSettings(max_queued_requests=-1)
    with pytest.raises(ValueError, match="api_key"):
        ServerSettings(api_key="")


@pytest.mark.parametrize("key", ["tokenize", "9" * 10_000, "not an identifier " * 1000])
def test_a_refused_chat_template_kwargs_key_is_named_but_cut_short(key):
    """The 400 names the refused key, cut to a few characters so a huge key is not echoed back."""
    with pytest.raises(APIError) as refused:
        ChatRendering(template_kwargs={key: True}).check()
    shown = key if len(key) <= MAX_SHOWN_KEY_CHARS else key[:MAX_SHOWN_KEY_CHARS] + "..."
    assert refused.value.param == f"chat_template_kwargs.{shown}"
    assert refused.value.message.startswith(f"chat_template_kwargs.{shown}: ")
    assert len(refused.value.message) < 100

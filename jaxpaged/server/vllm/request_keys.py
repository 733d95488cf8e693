"""vLLM's request keys this server cannot honour: a 400 naming the key, not a silent difference.

Unknown keys stay ignored, as OpenAI clients send fields a server has no use for (user, metadata, ...). But a key
vLLM defines changes vLLM's output; ignoring it would answer a different request. Each key below is refused only
when it asks for something: null, or the value that means "off", passes.
"""

from typing import Any

from jaxpaged.server.http.errors import APIError

_OFF = object()
"""Any value other than null is refused."""

_SAMPLING_KEYS: dict[str, Any] = {
    "use_beam_search": False, "length_penalty": 1.0, "guided_decoding_backend": _OFF,
    "guided_whitespace_pattern": _OFF, "logits_processors": _OFF,
    "kv_transfer_params": _OFF, "vllm_xargs": _OFF, "spaces_between_special_tokens": True,
    "repetition_detection": _OFF, "thinking_token_budget": _OFF,
}
_STRUCTURED_OUTPUTS_KEYS: dict[str, Any] = {
    "structural_tag": _OFF, "whitespace_pattern": _OFF, "disable_any_whitespace": False, "disable_fallback": False,
    "disable_additional_properties": False,
}
_CHAT_KEYS: dict[str, Any] = {
    "chat_template": _OFF, "documents": _OFF, "mm_processor_kwargs": _OFF, "echo": False, "add_special_tokens": False,
    "media_io_kwargs": _OFF,
}
_COMPLETION_KEYS: dict[str, Any] = {"prompt_embeds": _OFF, "add_special_tokens": True}


def _refused(keys: dict[str, Any], payload: dict, prefix: str = "") -> None:
    for key, off in keys.items():
        value = payload.get(key)
        if value is None or (off is not _OFF and value == off and isinstance(value, bool) == isinstance(off, bool)):
            continue
        raise APIError(400, f"{prefix}{key}: vLLM's parameter is not supported by this server", param=prefix + key,
                       code="unsupported")


def reject_unhonoured_keys(payload: Any, chat: bool) -> None:
    """400 naming the first vLLM key in a decoded body that this server would have to ignore."""
    if not isinstance(payload, dict):
        return  # the schema's own check says what is wrong
    _refused({**_SAMPLING_KEYS, **(_CHAT_KEYS if chat else _COMPLETION_KEYS)}, payload)
    structured = payload.get("structured_outputs")
    if isinstance(structured, dict):
        _refused(_STRUCTURED_OUTPUTS_KEYS, structured, "structured_outputs.")


def refused_keys(chat: bool) -> dict[str, Any]:
    """The vLLM keys an endpoint refuses, each with the value that still passes besides null (None: only null);
    structured_outputs' own as `structured_outputs.<key>` (docs/vllm-compatibility.md's "not yet" keys)."""
    keys = {**_SAMPLING_KEYS, **(_CHAT_KEYS if chat else _COMPLETION_KEYS),
            **{f"structured_outputs.{key}": off for key, off in _STRUCTURED_OUTPUTS_KEYS.items()}}
    return {key: None if off is _OFF else off for key, off in keys.items()}

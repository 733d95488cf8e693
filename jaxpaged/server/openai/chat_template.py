"""--chat-template: a Jinja chat template from a file or inline (as vLLM takes it), checked at start-up."""

import os
from typing import Any, Optional

_INLINE_MARKERS = ("{", "}", "\n")
_PROBE = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"},
          {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"}]


def load_chat_template(value: Optional[str]) -> Optional[str]:
    """The template text of --chat-template: a file's contents, or `value` itself when it reads as a template;
    ValueError naming the flag for a path that does not exist."""
    if value is None:
        return None
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            return file.read()
    if any(marker in value for marker in _INLINE_MARKERS):
        return value
    raise ValueError(f"chat_template: --chat-template {value!r} is neither a file nor an inline Jinja template")


def check_chat_template(tokenizer: Any, template: Optional[str]) -> None:
    """Renders a short conversation with `template` (None: the model's own, if it has one); ValueError naming
    --chat-template when it fails, so a broken template stops the start-up instead of failing every request."""
    if template is None:
        return
    try:
        tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True, chat_template=template)
    except Exception as error:  # jinja's TemplateSyntaxError, UndefinedError, raise_exception ...: all the template's
        raise ValueError(f"chat_template: --chat-template does not render a plain conversation: "
                         f"{type(error).__name__}: {error}") from None

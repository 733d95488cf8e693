"""POST /tokenize and POST /detokenize: the served model's tokenizer over HTTP (no engine work)."""

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from jaxpaged.server.context import ServerContext
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.generation import ensure_ready
from jaxpaged.server.openai.prompts import ChatRendering, tokenize_chat, tokenize_text
from jaxpaged.server.openai.protocol import DetokenizeRequest, TokenizeRequest
from jaxpaged.server.openai.validation import check_model_name, check_token_ids, parse_model, read_json_body


async def tokenize(request: Request, context: ServerContext) -> JSONResponse:
    """Token ids of a text prompt (or of chat messages rendered by the chat template)."""
    ensure_ready(context)
    engine = context.engine
    body = parse_model(TokenizeRequest, await read_json_body(request, context.settings.max_request_body_bytes))
    check_model_name(body.model, context.request_model_names)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt", code="invalid_value")
    if body.prompt is not None:
        token_ids = await tokenize_text(engine.tokenizer, body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        assert body.messages is not None  # exactly one of prompt and messages, checked above
        rendering = ChatRendering(body.add_generation_prompt, chat_template=context.settings.chat_template,
                                  template_kwargs=context.settings.chat_template_kwargs_for(
                                      body.chat_template_kwargs))
        _, token_ids = await tokenize_chat(engine.tokenizer, body.messages, rendering)
    return JSONResponse({"count": len(token_ids), "max_model_len": engine.max_model_len, "tokens": token_ids})


async def detokenize(request: Request, context: ServerContext) -> JSONResponse:
    """The text of token ids (every id must be in the vocabulary)."""
    ensure_ready(context)
    engine = context.engine
    body = parse_model(DetokenizeRequest, await read_json_body(request, context.settings.max_request_body_bytes))
    check_model_name(body.model, context.request_model_names)
    check_token_ids(body.tokens, engine.vocab_size, "tokens")
    text = await run_in_threadpool(engine.tokenizer.decode, body.tokens)
    return JSONResponse({"prompt": text})

"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} for every failure, never echoing input."""

import http
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}

_MAX_MESSAGE_CHARS = 300
# ValueErrors in this project read "field: what is wrong, got <the value>"; the value is user input.
_ECHOED_VALUE = re.compile(r",? got .*\Z", re.DOTALL)
_UNION_TAGS = {"body", "str", "int", "float", "bool", "list", "dict", "none"}
_FIELD_NAME = re.compile(r"[A-Za-z_][\w.\[\]]*")


class APIError(Exception):
    """An error answered with an HTTP status and the OpenAI error body."""

    def __init__(self, status_code: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status_code: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict:
    """The OpenAI error object for a status."""
    error_type = _ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "server_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    """The JSON response of an APIError."""
    return JSONResponse(error_body(error.status_code, error.message, error.param, error.code),
                        status_code=error.status_code, headers=error.headers)


def from_value_error(error: ValueError, *, code: str = "invalid_value") -> APIError:
    """A 400 from a ValueError that names its field first ("field: ..."), with the echoed value cut off."""
    text = str(error)
    field, colon, _ = text.partition(":")
    param = field if colon and _FIELD_NAME.fullmatch(field) else None
    return APIError(400, sanitize_message(text), param=param, code=code)


def sanitize_message(text: str) -> str:
    """Drops a trailing "got <value>" and caps the length, so no user input comes back in an error."""
    text = _ECHOED_VALUE.sub("", text)
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


def _loc_to_param(loc: tuple) -> str:
    """("messages", 0, "role") -> "messages[0].role"; pydantic's union tags ("str", "list[int]") are dropped."""
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif str(item).isidentifier() and item not in _UNION_TAGS:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """A 400 naming the first invalid field; pydantic's message only, never its `input`."""
    if not errors:
        return APIError(400, "invalid request", code="invalid_value")
    first = errors[0]
    param = _loc_to_param(tuple(first.get("loc", ()))) or None
    message = first.get("msg", "invalid value")
    return APIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    """Routes every exception the app can raise to an OpenAI error body."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(from_validation_errors(list(error.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = http.HTTPStatus(error.status_code).phrase
        except ValueError:
            phrase = "error"
        return error_response(APIError(error.status_code, phrase, headers=getattr(error, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(APIError(500, "internal server error", code="internal_error"))

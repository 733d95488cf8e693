"""LoRA adapters in the server as vLLM serves them: --lora-modules (name=path, or vLLM's JSON form) loaded at
start-up, each adapter's name a valid `model` and a /v1/models card whose parent is the base model, and the runtime
/v1/load_lora_adapter and /v1/unload_lora_adapter behind vLLM's opt-in (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or
JAXPAGED_ALLOW_RUNTIME_LORA_UPDATING).

A bad adapter is a 400 naming it and the field, and changes nothing: the others keep serving.
"""

import asyncio
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response

from jaxpaged.lora.host_cache import LoRAAdapterCache
from jaxpaged.lora.request import LoRARequest
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.validation import read_json_body
from jaxpaged.server.vllm.lora_modules import LoRAModule

if TYPE_CHECKING:
    from jaxpaged.server.context import ServerContext

RUNTIME_UPDATING_ENV = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "JAXPAGED_ALLOW_RUNTIME_LORA_UPDATING")
"""Either set to true opens the load and unload endpoints (vLLM's variable, and jaxpaged's own)."""


def runtime_updating_allowed(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the runtime load/unload endpoints are open (vLLM's opt-in, or jaxpaged's)."""
    return any(environ.get(name, "").strip().lower() in ("true", "1") for name in RUNTIME_UPDATING_ENV)


def load_lora_modules(adapters: Optional[LoRAAdapterCache], modules: tuple[LoRAModule, ...],
                      base_names: tuple[str, ...]) -> None:
    """The --lora-modules read and served (ids 1, 2, ...); ValueError naming the adapter and field of a bad one."""
    if modules and adapters is None:
        raise ValueError("lora_modules: --lora-modules needs --enable-lora")
    for module in modules:
        _add(adapters, module.name, module.path, module.base_model_name, base_names)


def model_cards(adapters: Optional[LoRAAdapterCache], parent: str, created: int) -> list[dict[str, Any]]:
    """The /v1/models cards of the served adapters, each naming the base model as its parent (as vLLM's do)."""
    if adapters is None:
        return []
    return [{"id": lora.lora_name, "object": "model", "created": created, "owned_by": "jaxpaged",
             "root": lora.lora_path, "parent": parent, "max_model_len": None} for lora in adapters.served()]


def install_lora_routes(app: FastAPI, context: "ServerContext") -> None:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter, when runtime updating is allowed."""
    if not runtime_updating_allowed():
        return

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        name, path = await _name_and_path(request, context, needs_path=True)
        adapters = _enabled(context)
        try:  # reading the adapter's files runs off the event loop: other requests keep streaming meanwhile
            await asyncio.to_thread(_add, adapters, name, path, None, context.model_names)
        except ValueError as error:
            raise APIError(400, str(error), param="lora_name", code="invalid_value") from error
        return Response(f"Success: LoRA adapter '{name}' added successfully.", media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        name, _ = await _name_and_path(request, context, needs_path=False)
        if _enabled(context).remove(name) is None:
            raise APIError(404, f"lora_name: no LoRA adapter named {name!r} is loaded", param="lora_name",
                           code="not_found")
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", media_type="text/plain")


def _enabled(context: "ServerContext") -> LoRAAdapterCache:
    adapters = context.lora_adapters
    if adapters is None:
        raise APIError(400, "lora_name: this server runs without --enable-lora", param="lora_name",
                       code="invalid_value")
    return adapters


async def _name_and_path(request: Request, context: "ServerContext", needs_path: bool) -> tuple[str, str]:
    payload = await read_json_body(request, context.settings.max_request_body_bytes)
    if not isinstance(payload, dict):
        raise APIError(400, "the body must be a JSON object", code="invalid_value")
    fields = ("lora_name", "lora_path") if needs_path else ("lora_name",)
    for field in fields:
        if not isinstance(payload.get(field), str) or not payload[field]:
            raise APIError(400, f"{field}: must be a non-empty string", param=field, code="invalid_value")
    return payload["lora_name"], payload.get("lora_path") or ""


def _add(adapters: Optional[LoRAAdapterCache], name: str, path: str, base_model_name: Optional[str],
         base_names: tuple[str, ...]) -> LoRARequest:
    """Read, check and serve one adapter under the next free id; ValueError naming the adapter and the field."""
    if adapters is None:
        raise ValueError("lora_modules: LoRA adapters need --enable-lora")
    if name in base_names:
        raise ValueError(f"lora_name: {name!r} is the base model's name")
    lora = LoRARequest(name, adapters.next_free_id(), path, base_model_name)
    adapters.add(lora)
    return lora

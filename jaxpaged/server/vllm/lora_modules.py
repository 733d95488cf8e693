"""--lora-modules entries (vLLM's `name=path` or JSON form): what the server settings hold of each adapter named at
start-up (server/vllm/lora_adapters.py loads them and serves the runtime endpoints)."""

import dataclasses
import json
from typing import Optional


@dataclasses.dataclass(frozen=True)
class LoRAModule:
    """One --lora-modules entry."""

    name: str
    path: str
    base_model_name: Optional[str] = None


def parse_lora_module(text: str) -> LoRAModule:
    """`name=path` or vLLM's '{"name": ..., "path": ..., "base_model_name": ...}'; ValueError naming the flag."""
    if text.lstrip().startswith("{"):
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--lora-modules: {text!r} is not valid JSON ({error})") from error
        unknown = sorted(set(fields) - {"name", "path", "base_model_name"}) if isinstance(fields, dict) else []
        if not isinstance(fields, dict) or unknown or not all(
                isinstance(fields.get(key), str) and fields[key] for key in ("name", "path")):
            raise ValueError(f"--lora-modules: a JSON entry needs string \"name\" and \"path\" (and optionally "
                             f"\"base_model_name\") only, got {text!r}")
        return LoRAModule(fields["name"], fields["path"], fields.get("base_model_name"))
    name, separator, path = text.partition("=")
    if not separator or not name or not path:
        raise ValueError(f"--lora-modules: expected name=path or a JSON object, got {text!r}")
    return LoRAModule(name, path)

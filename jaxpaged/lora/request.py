"""LoRARequest: which adapter a request runs with, as vLLM names it (vllm/lora/request.py)."""

import dataclasses
from typing import Optional

from jaxpaged.checks import is_int


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter by name, a positive int id unique among the loaded adapters, and its directory."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None
    """The base model it was trained on (vLLM's --lora-modules JSON form); informational."""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name: must be a non-empty str, got {self.lora_name!r}")
        if not is_int(self.lora_int_id) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id: must be an int >= 1 (0 is the base model), got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path: must be the adapter's directory, got {self.lora_path!r}")

    @property
    def adapter_id(self) -> int:
        """vLLM's alias of lora_int_id."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """vLLM's alias of lora_name."""
        return self.lora_name

    @property
    def path(self) -> str:
        """vLLM's alias of lora_path."""
        return self.lora_path

"""LoRAAdapterCache: the adapters requests may name (by name), every adapter ever added (by id), and an LRU of
them read into host memory (max_cpu_loras).

Reading an adapter checks it against the base model (peft_adapter.py), so a bad adapter is refused when a request
names it, before anything is queued. An adapter evicted from the LRU is read again from its directory when a
request needs it in a device slot; a removed one too, for the requests still running with it (removing only stops
new requests from naming it). Thread-safe: the server adds and removes adapters off the engine's thread.
"""

import collections
import threading
from typing import Optional

from jaxpaged.lora.peft_adapter import PeftAdapter, read_peft_adapter
from jaxpaged.lora.request import LoRARequest
from jaxpaged.models.model_config import ModelConfig


class LoRAAdapterCache:
    """Known adapters by id, and the max_cpu_loras most recently used read into host memory."""

    def __init__(self, cfg: ModelConfig, max_lora_rank: int, max_cpu_loras: int) -> None:
        self._cfg = cfg
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self._known: dict[int, LoRARequest] = {}
        """Every adapter added, by id (kept after removal: a running request may need it read again)."""
        self._served: dict[str, LoRARequest] = {}
        """The adapters requests may name, by name."""
        self._read: collections.OrderedDict[int, PeftAdapter] = collections.OrderedDict()
        self._lock = threading.Lock()  # the server reads adapters off the engine's thread (load_lora_adapter)

    def add(self, request: LoRARequest) -> PeftAdapter:
        """The adapter of `request`, read (and checked) unless it is in the LRU, and servable by its name;
        ValueError naming the adapter and the field when it is bad, or its id or name is another adapter's."""
        with self._lock:
            self._check_unique(request)
            adapter = self._read.get(request.lora_int_id)
        if adapter is None:
            adapter = read_peft_adapter(request, self._cfg, self.max_lora_rank)  # outside the lock: file reads
        with self._lock:
            self._check_unique(request)  # again: another thread may have added one meanwhile
            self._known[request.lora_int_id] = request
            self._served[request.lora_name] = request
            self._remember(adapter)
        return adapter

    def _check_unique(self, request: LoRARequest) -> None:
        known = self._known.get(request.lora_int_id)
        if known is not None and (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
            raise ValueError(f"lora_int_id: {request.lora_int_id} is LoRA adapter {known.lora_name!r} "
                             f"({known.lora_path}); {request.lora_name!r} needs an id of its own")
        served = self._served.get(request.lora_name)
        if served is not None and served != request:
            raise ValueError(f"lora_name: a LoRA adapter named {request.lora_name!r} is already loaded "
                             f"({served.lora_path}, id {served.lora_int_id})")

    def get(self, adapter_id: int) -> PeftAdapter:
        """An adapter ever added, from the LRU or read again; KeyError for an unknown id."""
        with self._lock:
            adapter = self._read.get(adapter_id)
            if adapter is not None:
                self._read.move_to_end(adapter_id)
                return adapter
            request = self._known[adapter_id]
        adapter = read_peft_adapter(request, self._cfg, self.max_lora_rank)
        with self._lock:
            self._remember(adapter)
        return adapter

    def remove(self, lora_name: str) -> Optional[LoRARequest]:
        """Stop serving an adapter by name (unload_lora_adapter); the removed one, or None if none had the name."""
        with self._lock:
            request = self._served.pop(lora_name, None)
            if request is not None:
                self._read.pop(request.lora_int_id, None)
            return request

    def by_name(self, lora_name: str) -> Optional[LoRARequest]:
        """The served adapter of that name, if any."""
        with self._lock:
            return self._served.get(lora_name)

    def served(self) -> list[LoRARequest]:
        """The adapters requests may name, in id order."""
        with self._lock:
            return sorted(self._served.values(), key=lambda request: request.lora_int_id)

    def next_free_id(self) -> int:
        """An id no adapter ever added has (the server numbers the adapters it loads so)."""
        with self._lock:
            return max(self._known, default=0) + 1

    def num_read(self) -> int:
        """Adapters held in host memory now."""
        return len(self._read)

    def _remember(self, adapter: PeftAdapter) -> None:
        self._read[adapter.request.lora_int_id] = adapter
        self._read.move_to_end(adapter.request.lora_int_id)
        while len(self._read) > self.max_cpu_loras:
            self._read.popitem(last=False)

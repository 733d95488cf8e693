"""LoRAAdapterCache: the adapters the engine knows (by id) and an LRU of them read into host memory (max_cpu_loras).

Reading an adapter checks it against the base model (peft_adapter.py), so a bad adapter is refused when a request
names it, before anything is queued. An adapter evicted from the LRU is read again from its directory when a
request needs it in a device slot.
"""

import collections
import threading

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
        self._read: collections.OrderedDict[int, PeftAdapter] = collections.OrderedDict()
        self._lock = threading.Lock()  # the server reads adapters off the engine's thread (load_lora_adapter)

    def add(self, request: LoRARequest) -> PeftAdapter:
        """The adapter of `request`, read (and checked) unless it is in the LRU; ValueError naming the adapter and
        the field when it is bad, or when its id is another adapter's."""
        with self._lock:
            known = self._known.get(request.lora_int_id)
            if known is not None and (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
                raise ValueError(f"lora_int_id: {request.lora_int_id} is LoRA adapter {known.lora_name!r} "
                                 f"({known.lora_path}); {request.lora_name!r} needs an id of its own")
            adapter = self._read.get(request.lora_int_id)
        if adapter is None:
            adapter = read_peft_adapter(request, self._cfg, self.max_lora_rank)  # outside the lock: file reads
        with self._lock:
            self._known[request.lora_int_id] = request
            self._remember(adapter)
        return adapter

    def get(self, adapter_id: int) -> PeftAdapter:
        """A known adapter, from the LRU or read again; KeyError for an unknown id."""
        with self._lock:
            adapter = self._read.get(adapter_id)
            if adapter is not None:
                self._read.move_to_end(adapter_id)
                return adapter
            request = self._known[adapter_id]
        return self.add(request)

    def remove(self, adapter_id: int) -> bool:
        """Forget an adapter (unload_lora_adapter); False if it was not known."""
        with self._lock:
            self._read.pop(adapter_id, None)
            return self._known.pop(adapter_id, None) is not None

    def known(self) -> list[LoRARequest]:
        """Every known adapter, in id order."""
        with self._lock:
            return [self._known[adapter_id] for adapter_id in sorted(self._known)]

    def num_read(self) -> int:
        """Adapters held in host memory now."""
        return len(self._read)

    def _remember(self, adapter: PeftAdapter) -> None:
        self._read[adapter.request.lora_int_id] = adapter
        self._read.move_to_end(adapter.request.lora_int_id)
        while len(self._read) > self.max_cpu_loras:
            self._read.popitem(last=False)

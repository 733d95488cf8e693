"""LoRASlots: the device slot arrays of one rank and the table of which adapter sits in which slot.

Per target projection, A [layers, max_loras + 1, max_lora_rank, in] and B [layers, max_loras + 1, out,
max_lora_rank] (per layer on the CPU, as the decoder's own weights are: llama.DecoderLayers). Slot 0 is zeros (no
adapter); an adapter of a lower rank fills the leading rank columns and leaves the rest zero, which adds nothing.
A host copy of every array is kept: writing a slot changes the host copy and places fresh device arrays of the same
shapes and shardings, so the compiled step's executables serve them as they are (never a compile).

Under tensor parallelism each array splits as its projection does: a column-parallel projection's B on its out axis,
a row-parallel one's A on its in axis; the other stays replicated (the rank axis is never split).
"""

import collections
from collections.abc import Callable, Sequence
from typing import Union

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpaged.lora.peft_adapter import PeftAdapter, projection_dims
from jaxpaged.lora.slot_names import lora_a_name, lora_b_name
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.runner.mesh import MODEL_AXIS

_ROW_PARALLEL = ("o_proj", "down_proj")
"""Projections whose input axis is split under tensor parallelism (the others split their output axis)."""

Placed = dict[str, Union[jax.Array, list[jax.Array]]]


class LoRASlots:
    """max_loras adapter slots (plus slot 0, none) on one rank's devices, reused least recently used first."""

    def __init__(self, cfg: ModelConfig, max_loras: int, max_lora_rank: int, dtype: np.dtype, mesh: Mesh,
                 per_layer: bool, kv_head_repeats: int = 1) -> None:
        """`cfg`: the model as the runner holds it (KV heads already repeated `kv_head_repeats` times for tensor
        parallelism: an adapter's k/v B, read against the checkpoint's heads, is repeated alike)."""
        self.num_slots = max_loras + 1
        self.max_lora_rank = max_lora_rank
        self._mesh, self._per_layer, self._kv_head_repeats = mesh, per_layer, kv_head_repeats
        self._head_dim = cfg.head_dim
        self._dtype = np.dtype(dtype)
        self._host: dict[str, np.ndarray] = {}
        self._specs: dict[str, P] = {}
        for target, (inner, outer) in projection_dims(cfg).items():
            row_parallel = target in _ROW_PARALLEL
            self._host[lora_a_name(target)] = np.zeros((cfg.num_layers, self.num_slots, max_lora_rank, inner), dtype)
            self._specs[lora_a_name(target)] = P(None, None, None, MODEL_AXIS if row_parallel else None)
            self._host[lora_b_name(target)] = np.zeros((cfg.num_layers, self.num_slots, outer, max_lora_rank), dtype)
            self._specs[lora_b_name(target)] = P(None, None, None if row_parallel else MODEL_AXIS, None)
        self._slot_of: collections.OrderedDict[int, int] = collections.OrderedDict()
        """Adapter id -> its slot, least recently used first."""
        self.placed: Placed = self._place()
        """The device arrays the model reads now (replaced, never changed in place, by every write)."""
        self.num_writes = 0
        """Slots written so far (adapters loaded to the device)."""

    def slot_of(self, adapter_id: int) -> int:
        """The slot holding adapter `adapter_id`, or 0 when none does."""
        return self._slot_of.get(adapter_id, 0)

    def loaded_ids(self) -> list[int]:
        """The adapters in slots, least recently used first."""
        return list(self._slot_of)

    def assign(self, adapter_ids: Sequence[int], fetch: Callable[[int], PeftAdapter]) -> tuple[list[int], bool]:
        """Each id's slot (0 for id 0), loading the adapters not in a slot (`fetch(id)` gives one) into free or
        least recently used slots that no id of this batch holds; and whether any slot was written (then `placed`
        is new). ValueError when the batch holds more adapters than slots (the scheduler keeps it within)."""
        wanted = list(dict.fromkeys(adapter_id for adapter_id in adapter_ids if adapter_id))
        if len(wanted) > self.num_slots - 1:
            raise ValueError(f"max_loras: a step holds {len(wanted)} adapters, more than the {self.num_slots - 1} "
                             "slots")
        wrote = False
        for adapter_id in wanted:
            if adapter_id in self._slot_of:
                self._slot_of.move_to_end(adapter_id)
                continue
            used = set(self._slot_of.values())
            free = [slot for slot in range(1, self.num_slots) if slot not in used]
            if free:
                slot = free[0]
            else:
                victim = next(held for held in self._slot_of if held not in wanted)
                slot = self._slot_of.pop(victim)
            self._write(slot, fetch(adapter_id))
            self._slot_of[adapter_id] = slot
            wrote = True
        if wrote:
            self.placed = self._place()
        return [self._slot_of[adapter_id] if adapter_id else 0 for adapter_id in adapter_ids], wrote

    def _write(self, slot: int, adapter: PeftAdapter) -> None:
        """The adapter's A and B into `slot` of the host arrays (zeros where it has no weights or rank)."""
        for host in self._host.values():
            host[:, slot] = 0
        for target, (a, b) in adapter.weights.items():
            rank = a.shape[1]
            if target in ("k_proj", "v_proj") and self._kv_head_repeats > 1:
                heads = b.reshape(b.shape[0], -1, self._head_dim, rank)
                b = np.repeat(heads, self._kv_head_repeats, axis=1).reshape(b.shape[0], -1, rank)
            self._host[lora_a_name(target)][:, slot, :rank, :] = a
            self._host[lora_b_name(target)][:, slot, :, :rank] = b
        self.num_writes += 1

    def _place(self) -> Placed:
        """Every host array on the devices: a list of per-layer arrays, or stacked (bfloat16 as its uint16 bits,
        which llama.DecoderLayers stores stacked weights as)."""
        placed: Placed = {}
        for name, host in self._host.items():
            spec = self._specs[name]
            if self._per_layer:
                sharding = NamedSharding(self._mesh, P(*spec[1:]))
                placed[name] = [jax.device_put(layer, sharding) for layer in host]
            else:
                stored = host.view(np.uint16) if host.dtype == ml_dtypes.bfloat16 else host
                placed[name] = jax.device_put(stored, NamedSharding(self._mesh, spec))
        return placed

"""Multi-LoRA serving: PEFT adapters on one base model (request.py, peft_adapter.py), kept on the host in an LRU
(host_cache.py) and in fixed-shape device slots (slots.py) that the model's projections read through one batched
low-rank product per projection (projection.py)."""

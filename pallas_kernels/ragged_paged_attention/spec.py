"""The spec: what ragged paged attention computes, as a plain float64 loop anyone can check by eye.

One step mixes prefill chunks and decodes on one token axis. Sequence s owns q rows
cu_q_lens[s]:cu_q_lens[s+1]; its i-th new token sits at absolute position kv_lens[s] - q_len_s + i and
attends causally to KV positions 0..position (the last `sliding_window` of them when set), reading KV
position p from slot block_tables[s, p // page_size] * page_size + p % page_size. Query head j reads
KV head j // (num_q_heads // num_kv_heads) (GQA). Logits are q.k * sm_scale, then soft-capped
(soft_cap * tanh(logits / soft_cap)) when asked. Attention sinks (gpt-oss), when given, are one learned logit per q
head that joins the softmax's denominator only: out = sum_j exp(s_j - m) v_j / (exp(sink - m) + sum_j exp(s_j - m)),
m the largest of the sink and the logits. Rows that belong to no real sequence are zeros.

Every backend (tpu.py, gpu.py, and the engine's "xla" one) is tested against this loop. It is slow on purpose: host
numpy, no chunking, no online softmax; never call it from the engine.
"""

from typing import Optional

import numpy as np

from pallas_kernels.ragged_paged_attention.metadata import AttentionMetadata


def ragged_paged_attention_spec(q, kv_pages, metadata: AttentionMetadata, *, sm_scale: float,
                                sliding_window: Optional[int] = None,
                                soft_cap: Optional[float] = None, sinks=None) -> np.ndarray:
    """[num_tokens, num_q_heads, head_dim] float64 attention output of every q row."""
    q = np.asarray(q, np.float64)
    kv_pages = np.asarray(kv_pages, np.float64)
    kv_lens, block_tables, cu_q_lens = (np.asarray(a) for a in (metadata.kv_lens, metadata.block_tables,
                                                                 metadata.cu_q_lens))
    num_q_heads = q.shape[1]
    page_size = kv_pages.shape[1]
    group_size = num_q_heads // (kv_pages.shape[2] // 2)
    sinks = None if sinks is None else np.asarray(sinks, np.float64).reshape(num_q_heads)
    out = np.zeros_like(q)
    for s in range(int(np.asarray(metadata.num_seqs).reshape(-1)[0])):
        start, end, kv_len = int(cu_q_lens[s]), int(cu_q_lens[s + 1]), int(kv_lens[s])
        slots = [(int(block_tables[s, p // page_size]), p % page_size) for p in range(kv_len)]
        keys = np.stack([kv_pages[page, offset, 0::2] for page, offset in slots])    # [kv_len, kv_heads, d]
        values = np.stack([kv_pages[page, offset, 1::2] for page, offset in slots])
        for i in range(end - start):
            position = kv_len - (end - start) + i
            first = 0 if sliding_window is None else max(0, position - sliding_window + 1)
            for head in range(num_q_heads):
                kv_head = head // group_size
                logits = keys[first:position + 1, kv_head] @ q[start + i, head] * sm_scale
                if soft_cap is not None:
                    logits = soft_cap * np.tanh(logits / soft_cap)
                top = logits.max() if sinks is None else max(logits.max(), sinks[head])
                weights = np.exp(logits - top)
                denominator = weights.sum() + (0.0 if sinks is None else np.exp(sinks[head] - top))
                out[start + i, head] = weights @ values[first:position + 1, kv_head] / denominator
    return out


def write_kv_spec(kv_pages, k, v, slot_mapping) -> np.ndarray:
    """The cache after writing token t's K/V heads at slot slot_mapping[t] (K at head 2h, V at 2h + 1)."""
    out = np.array(kv_pages)
    page_size = out.shape[1]
    for token, slot in enumerate(np.asarray(slot_mapping)):
        out[slot // page_size, slot % page_size, 0::2] = np.asarray(k)[token]
        out[slot // page_size, slot % page_size, 1::2] = np.asarray(v)[token]
    return out

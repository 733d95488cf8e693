"""The roofline's lower bound, hand-worked on a tiny model, and the machine rates it is measured against."""

import pytest

from jaxpaged.bench.roofline import MachineRates, lower_bound_seconds, matmul_params_per_token, weight_bytes
from jaxpaged.bench.workloads import BenchRequest
from jaxpaged.models.model_config import ModelConfig

# 2 layers, hidden 4, 2 q heads and 1 kv head of dim 2, MLP 8, vocabulary 10.
MODEL = ModelConfig(architecture="LlamaForCausalLM", vocab_size=10, hidden_size=4, intermediate_size=8,
                    num_layers=2, num_q_heads=2, num_kv_heads=1, head_dim=2, rms_norm_eps=1e-5, rope_theta=1e4,
                    max_position_embeddings=64, tie_word_embeddings=True)
RATES = MachineRates(copy_bytes_per_s=1000.0, dot_flops_per_s={"float32": {"decode": 100.0, "prefill": 1000.0},
                                                                 "bfloat16": {"decode": 200.0, "prefill": 2000.0},
                                                                 "int8": {"decode": 400.0, "prefill": 4000.0}})


def test_model_sizes_by_hand():
    # per layer: q 4x4, k and v 4x2 each, o 4x4, MLP 3 x 4x8 = 16 + 16 + 16 + 96 = 144; 2 layers
    assert matmul_params_per_token(MODEL) == 288
    assert weight_bytes(MODEL, "float32") == (288 + 40) * 4 and weight_bytes(MODEL, "bfloat16") == (288 + 40) * 2
    assert weight_bytes(MODEL, "float32", quantized=True) == 288 + 40 * 4  # int8 projections, float32 vocabulary


def test_lower_bound_by_hand():
    """One 3-token prompt, 3 output tokens: a prefill, then 2 decode steps at context 4 and 5."""
    bound = lower_bound_seconds(MODEL, [BenchRequest((1, 2, 3), 3)], RATES, "float32", max_num_seqs=1)
    attention_per_kv = 4 * 2 * 2 * 2  # (QK^T + PV) x 2 flops x q heads x head dim x layers = 32
    prefill_flops = 2 * 288 * 3 + attention_per_kv * 6 + 2 * 4 * 10  # 6 = 1 + 2 + 3 attended positions
    assert bound["roofline_prefill_s"] == pytest.approx(prefill_flops / 1000.0)
    decode_flops = sum(2 * 288 + attention_per_kv * context + 80 for context in (4, 5))
    assert bound["roofline_decode_compute_s"] == pytest.approx(decode_flops / 100.0)
    kv_bytes_per_token = 2 * 1 * 2 * 2 * 4  # K and V, 1 kv head of dim 2, 2 layers, float32
    decode_bytes = 2 * (288 + 40) * 4 + (4 + 5) * kv_bytes_per_token
    assert bound["roofline_decode_memory_s"] == pytest.approx(decode_bytes / 1000.0)
    expected = prefill_flops / 1000.0 + max(decode_flops / 100.0, decode_bytes / 1000.0)
    assert bound["roofline_s"] == pytest.approx(expected)


def test_int8_projections_run_at_the_int8_rate_and_bytes_the_rest_in_the_model_dtype():
    bound = lower_bound_seconds(MODEL, [BenchRequest((1, 2, 3), 3)], RATES, "float32", max_num_seqs=1,
                                quantization="int8")
    attention_per_kv = 32
    prefill = 2 * 288 * 3 / 4000.0 + (attention_per_kv * 6 + 2 * 4 * 10) / 1000.0
    assert bound["roofline_prefill_s"] == pytest.approx(prefill)
    decode = 2 * 2 * 288 / 400.0 + sum(attention_per_kv * context + 80 for context in (4, 5)) / 100.0
    assert bound["roofline_decode_compute_s"] == pytest.approx(decode)
    decode_bytes = 2 * (288 + 40 * 4) + (4 + 5) * 2 * 1 * 2 * 2 * 4  # the KV stays float32
    assert bound["roofline_decode_memory_s"] == pytest.approx(decode_bytes / 1000.0)


def test_batching_shares_the_weight_reads_and_bfloat16_halves_the_bytes():
    one = lower_bound_seconds(MODEL, [BenchRequest((1, 2, 3), 3)], RATES, "float32", max_num_seqs=8)
    eight = lower_bound_seconds(MODEL, [BenchRequest((1, 2, 3), 3)] * 8, RATES, "float32", max_num_seqs=8)
    two_at_a_time = lower_bound_seconds(MODEL, [BenchRequest((1, 2, 3), 3)] * 8, RATES, "float32", max_num_seqs=2)
    weights_per_step = (288 + 40) * 4 / 1000.0
    # 8 requests batched: still 2 decode steps of weight reads, 8x the KV reads.
    assert eight["roofline_decode_memory_s"] - 8 * one["roofline_decode_memory_s"] == pytest.approx(
        -7 * 2 * weights_per_step)
    assert two_at_a_time["roofline_decode_memory_s"] > eight["roofline_decode_memory_s"]  # 8 steps, not 2
    bf16 = lower_bound_seconds(MODEL, [BenchRequest((1, 2, 3), 3)], RATES, "bfloat16", max_num_seqs=1)
    assert bf16["roofline_decode_memory_s"] == pytest.approx(one["roofline_decode_memory_s"] / 2)


def test_two_measurements_combine_at_the_better_of_each_rate():
    first = MachineRates(10.0, {"float32": {"decode": 5.0, "prefill": 9.0},
                                "bfloat16": {"decode": 8.0, "prefill": 2.0}})
    later = MachineRates(12.0, {"float32": {"decode": 4.0, "prefill": 9.5},
                                "bfloat16": {"decode": 3.0, "prefill": 7.0}})
    best = first.best_of(later)
    assert best.copy_bytes_per_s == 12.0
    assert best.dot_flops_per_s == {"float32": {"decode": 5.0, "prefill": 9.5},
                                    "bfloat16": {"decode": 8.0, "prefill": 7.0}}
    assert first.best_of(later) == later.best_of(first)


def test_the_int8_rate_is_the_better_of_xlas_int8_dot_and_the_native_vnni_matmul(monkeypatch):
    """Where the VNNI kernel builds, w8a8 steps may run it, so the int8 rate takes whichever of the two is faster
    (here the VNNI matmul, timed at half XLA's seconds: twice the rate); float rates are untouched by it."""
    from jaxpaged.bench import roofline
    from jaxpaged.kernels.cpu_native.vnni_matmul import vnni_available

    if not vnni_available():
        pytest.skip("this CPU has no VPDPBUSD (AVX-512 VNNI / AVX-VNNI)")
    timed = []

    def fake_seconds(run, repeats):
        run()  # the real product, so a broken path fails here
        operand = run.args[2]
        vnni = operand.dtype == "int8" and operand.ndim == 3
        timed.append(vnni)
        return [0.5 if vnni else 1.0] * repeats

    monkeypatch.setattr(roofline, "call_seconds", fake_seconds)
    monkeypatch.setattr(roofline, "copy_bytes_per_s", lambda repeats: 1.0)
    model = ModelConfig(architecture="LlamaForCausalLM", vocab_size=10, hidden_size=32, intermediate_size=64,
                        num_layers=1, num_q_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e4,
                        max_position_embeddings=64, tie_word_embeddings=True)
    rates = roofline.measure_rates(model, decode_rows=4, prefill_rows=8, repeats=1)
    assert timed.count(True) == 2  # the VNNI matmul at decode and prefill rows
    assert rates.dot_flops_per_s["int8"]["decode"] == pytest.approx(2 * 4 * 32 * 64 / 0.5)
    assert rates.dot_flops_per_s["int8"]["prefill"] == pytest.approx(2 * 8 * 32 * 64 / 0.5)
    assert rates.dot_flops_per_s["float32"]["decode"] == pytest.approx(2 * 4 * 32 * 64 / 1.0)

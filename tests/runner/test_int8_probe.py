"""The start-up probe for weight-only int8's matmul (runner/int8_probe.py): it keeps the fastest path and names
every figure, warns when the float matmul beats every int8 one, keeps its verdict per CPU and per shape set,
measures again over a damaged verdict, and really times the candidates on a tiny model's shapes."""

import dataclasses
import json
import logging

import numpy as np
import pytest

from jaxpaged.config import EngineConfig
from jaxpaged.runner import int8_probe, probe_cache
from jaxpaged.runner.int8_probe import FLOAT, Int8Probe, ProbeShapes, choose_int8_matmul, probe_int8_matmul

_TINY = ProbeShapes((("q_proj", 32, 32), ("k_proj", 32, 16), ("v_proj", 32, 16), ("o_proj", 32, 32),
                     ("gate_proj", 32, 64), ("up_proj", 32, 64), ("down_proj", 64, 32)),
                    (16, 32), "float32", False, ("int16 digits", "panels", "xla"))


def test_the_fastest_path_by_its_geometric_mean_ratio_to_float_is_kept():
    """Decode and prefill count alike: 0.5x float's time at one row count and 1.5x at the other (0.87) beats 0.9x
    at both, though its summed seconds are larger."""
    probe = Int8Probe((64, 512), {FLOAT: (1.0, 10.0), "int16 digits": (0.5, 15.0), "panels": (0.9, 9.0),
                                  "xla": (2.0, 20.0)})
    assert probe.relative_time("int16 digits") == pytest.approx(np.sqrt(0.5 * 1.5))
    assert probe.choice == "int16 digits" and probe.beats_float
    line = probe.describe("float32", "measured now")
    assert line.startswith("int8 projections on this CPU: int16 digits, 1.15x float32's matmul speed")
    assert "panels 1.11x" in line and "xla 0.50x" in line and "64 and 512 rows" in line


def test_when_float_wins_the_line_says_int8_gives_memory_not_time_naming_the_ratio():
    probe = Int8Probe((64,), {FLOAT: (1.0,), "int16 digits": (4.0,), "xla": (1.25,)})
    assert probe.choice == "xla" and not probe.beats_float
    line = probe.describe("bfloat16", "measured now")
    assert "saves memory, not time" in line and "(xla) runs at 0.80x bfloat16's matmul speed" in line
    assert "int16 digits 0.25x" in line and "1 byte a weight, bfloat16's 2" in line


@pytest.fixture
def fake_timer(monkeypatch, tmp_path):
    """A fresh cache directory and a probe whose paths 'take' the seconds in `table` (set by the test); the list
    records every (path, rows) timed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed, table = [], {FLOAT: 2.0, "int16 digits": 3.0, "panels": 1.0, "xla": 2.5}

    def time_paths(paths, shapes, rows):
        timed.extend((path, rows) for path in paths)
        return [table[path] * rows for path in paths]

    monkeypatch.setattr(int8_probe, "_time_paths", time_paths)
    probe_int8_matmul.cache_clear()
    yield timed, table
    probe_int8_matmul.cache_clear()


def test_the_probe_times_every_path_at_every_row_count_and_keeps_the_verdict(fake_timer, caplog):
    timed, _ = fake_timer
    with caplog.at_level(logging.INFO, logger=int8_probe.__name__):
        first = probe_int8_matmul(_TINY)
    assert sorted(timed) == sorted((path, rows) for path in (FLOAT, *_TINY.candidates) for rows in _TINY.rows)
    assert first.choice == "panels" and "int8 projections on this CPU: panels, 2.00x" in caplog.text
    path = probe_cache.verdict_file("int8_probe", *_TINY.key())
    assert json.loads(path.read_text())["seconds"]["panels"] == [16.0, 32.0]
    probe_int8_matmul.cache_clear()  # a new process
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=int8_probe.__name__):
        again = probe_int8_matmul(_TINY)
    assert again == first and len(timed) == 4 * len(_TINY.rows)  # nothing timed again
    assert f"kept in {path}" in caplog.text


def test_a_slower_int8_is_a_warning_and_still_the_fastest_int8_path(fake_timer, caplog):
    """The projections stay int8 (the memory the user asked for); the warning names the ratio."""
    _, table = fake_timer
    table.update({FLOAT: 1.0, "panels": 1.25})
    with caplog.at_level(logging.INFO, logger=int8_probe.__name__):
        assert probe_int8_matmul(_TINY).choice == "panels"
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "(panels) runs at 0.80x float32's matmul speed" in warnings[0].getMessage()


def test_another_model_or_cpu_measures_again(fake_timer, monkeypatch):
    kept = probe_cache.verdict_file("int8_probe", *_TINY.key())
    other_model = dataclasses.replace(_TINY, projections=_TINY.projections[:-1] + (("down_proj", 96, 32),))
    assert probe_cache.verdict_file("int8_probe", *other_model.key()) != kept
    monkeypatch.setattr(probe_cache, "cpu_identity", lambda: "x86_64\nanother CPU\nflags: avx2")
    assert probe_cache.verdict_file("int8_probe", *_TINY.key()) != kept


@pytest.mark.parametrize("damage", ["", "{not json", '{"rows": [16, 32]}', '{"rows": [16], "seconds": {}}',
                                    '{"rows": [16, 32], "seconds": {"float": [1, 1], "int16 digits": [1, 1], '
                                    '"panels": [1, -1], "xla": [1, 1]}}'])
def test_a_damaged_verdict_is_measured_again(fake_timer, damage):
    timed, _ = fake_timer
    path = probe_cache.verdict_file("int8_probe", *_TINY.key())
    path.parent.mkdir(parents=True)
    path.write_text(damage)
    assert probe_int8_matmul(_TINY).choice == "panels"
    assert len(timed) == 4 * len(_TINY.rows)
    assert json.loads(path.read_text())["seconds"]["panels"] == [16.0, 32.0]


def test_the_probe_shapes_are_the_models_projections_at_the_steps_buckets():
    params = {"layers.q_proj": np.zeros((3, 64, 64), np.int8), "layers.down_proj": np.zeros((3, 128, 64), np.int8),
              "layers.input_norm": np.zeros((3, 64), np.float32), "layers.q_proj_scale": np.zeros((3, 64))}
    config = EngineConfig.from_options(max_num_seqs=20, max_num_batched_tokens=1024, max_model_len=1024)
    shapes = int8_probe.probe_shapes(params, config, np.float32, True)
    assert shapes.projections == (("q_proj", 64, 64), ("down_proj", 128, 64))
    assert shapes.rows == (32, int8_probe.PREFILL_ROWS_CAP)  # the bucket holding 20 decode rows; a prefill chunk


def test_the_plan_takes_the_probes_pick_on_a_cpu_and_times_nothing_elsewhere(fake_timer, monkeypatch):
    timed, _ = fake_timer
    monkeypatch.setattr(int8_probe, "int8_candidates",
                        lambda per_layer, tp, scheme="int8": ("w8a8",) if scheme == "w8a8" else _TINY.candidates)
    assert choose_int8_matmul("int8", "cpu", True, 1, True, _TINY) == "panels"
    timed.clear()
    assert choose_int8_matmul(None, "cpu", True, 1, True, _TINY) is None
    assert choose_int8_matmul("w8a8", "cpu", True, 1, True, _TINY) == "w8a8"  # one candidate: nothing to time
    assert choose_int8_matmul("int8", "gpu", False, 1, True, _TINY) == "xla"
    assert choose_int8_matmul("int8", "cpu", True, 1, False, _TINY) == "xla"  # cpu_matmul="xla"
    assert timed == []


def test_the_real_probe_times_a_tiny_shape_set_and_picks_a_candidate(monkeypatch, tmp_path):
    # Only the verdicts move to a fresh directory: the native kernels stay built in the cache directory.
    monkeypatch.setattr(probe_cache, "cache_root", lambda: tmp_path)
    probe_int8_matmul.cache_clear()
    shapes = ProbeShapes(_TINY.projections, (16,), "float32", True, int8_probe.int8_candidates(True, 1))
    try:
        probe = probe_int8_matmul(shapes)
    finally:
        probe_int8_matmul.cache_clear()
    assert probe.choice in shapes.candidates
    assert set(probe.seconds) == {FLOAT, *shapes.candidates}
    assert all(len(times) == 1 and times[0] > 0 for times in probe.seconds.values())


def test_several_processes_keep_the_flags_guess_and_time_nothing(fake_timer, monkeypatch):
    """Every process must build the same step, and timings on different hosts could disagree."""
    timed, _ = fake_timer
    monkeypatch.setattr(int8_probe.jax, "process_count", lambda: 2)
    monkeypatch.setattr(int8_probe, "cpu_has_int8_dot_units", lambda: True)
    assert choose_int8_matmul("int8", "cpu", True, 1, True, _TINY) == "int16 digits"
    assert timed == []


@pytest.mark.parametrize("vnni_seconds,expected", [(0.5, "vnni w8a8"), (3.0, "w8a8")])
def test_w8a8_times_xlas_dot_against_the_vnni_matmul_and_keeps_the_faster(fake_timer, monkeypatch, vnni_seconds,
                                                                          expected):
    """Where the VNNI kernel runs, w8a8's plan times it beside XLA's int8 dot (and the float baseline) and keeps the
    faster; off the CPU, or with cpu_matmul "xla", w8a8 stays on XLA's dot untimed."""
    timed, table = fake_timer
    table.update({"w8a8": 1.5, "vnni w8a8": vnni_seconds})
    monkeypatch.setattr(int8_probe, "vnni_available", lambda: True)
    assert int8_probe.int8_candidates(True, 1, "w8a8") == ("w8a8", "vnni w8a8")
    assert int8_probe.int8_candidates(True, 2, "w8a8") == ("w8a8",)  # the kernel runs on one device only
    assert choose_int8_matmul("w8a8", "cpu", True, 1, True, _TINY) == expected
    assert {path for path, _ in timed} == {FLOAT, "w8a8", "vnni w8a8"}
    timed.clear()
    assert choose_int8_matmul("w8a8", "gpu", False, 1, True, _TINY) == "w8a8"
    assert choose_int8_matmul("w8a8", "cpu", True, 1, False, _TINY) == "w8a8"
    assert timed == []


def test_a_slower_w8a8_warns_naming_its_scheme():
    probe = Int8Probe((64,), {FLOAT: (1.0,), "w8a8": (2.0,), "vnni w8a8": (1.25,)})
    assert probe.choice == "vnni w8a8" and not probe.beats_float
    line = probe.describe("float32", "measured now")
    assert line.startswith("quantization w8a8 on this CPU saves memory, not time: its fastest matmul (vnni w8a8)")


def test_weight_only_int8_times_the_digits_on_vnni_where_the_cpu_has_it(monkeypatch):
    """"vnni digits" is a weight-only int8 candidate only on one device with layers unrolled and VPDPBUSD."""
    monkeypatch.setattr(int8_probe, "packed_int8_available", lambda: True)
    monkeypatch.setattr(int8_probe, "vnni_available", lambda: True)
    monkeypatch.setattr(int8_probe, "int8_bf16_available", lambda: False)
    assert int8_probe.int8_candidates(True, 1) == ("int16 digits", "panels", "xla", "vnni digits")
    assert int8_probe.int8_candidates(True, 2) == ("int16 digits", "xla")
    monkeypatch.setattr(int8_probe, "vnni_available", lambda: False)
    assert int8_probe.int8_candidates(True, 1) == ("int16 digits", "panels", "xla")


@pytest.mark.parametrize("bf16_seconds,expected", [(0.5, "bf16 panels"), (3.0, "panels")])
def test_weight_only_int8_times_the_bf16_panels_where_the_cpu_has_avx512_bf16(fake_timer, monkeypatch, bf16_seconds,
                                                                              expected):
    """"bf16 panels" is a weight-only int8 candidate on one device with layers unrolled where the CPU has
    AVX512-BF16; the plan times it beside the others and keeps it only when it is the fastest."""
    timed, table = fake_timer
    table["bf16 panels"] = bf16_seconds
    monkeypatch.setattr(int8_probe, "packed_int8_available", lambda: True)
    monkeypatch.setattr(int8_probe, "vnni_available", lambda: False)
    monkeypatch.setattr(int8_probe, "int8_bf16_available", lambda: True)
    assert int8_probe.int8_candidates(True, 1) == ("int16 digits", "panels", "xla", "bf16 panels")
    assert int8_probe.int8_candidates(True, 2) == ("int16 digits", "xla")  # the kernel runs on one device only
    assert int8_probe.int8_candidates(False, 1) == ("int16 digits", "xla")
    assert choose_int8_matmul("int8", "cpu", True, 1, True, _TINY) == expected
    assert {path for path, _ in timed} == {FLOAT, "int16 digits", "panels", "xla", "bf16 panels"}
    monkeypatch.setattr(int8_probe, "int8_bf16_available", lambda: False)
    assert "bf16 panels" not in int8_probe.int8_candidates(True, 1)


def test_a_changed_kernel_or_header_it_includes_is_measured_again(tmp_path, monkeypatch):
    """The verdict's key covers every kernel the probe times and the local headers each includes: editing the VNNI
    kernel's header (not only packed_matmul.cc) gives a new key, so the old verdict is not read back."""
    from jaxpaged.kernels.cpu_native import vnni_matmul

    (tmp_path / "rows.h").write_text("// first\n")
    source = tmp_path / "kernel.cc"
    source.write_text('#include "rows.h"\n#include "xla/ffi/api/ffi.h"\n')
    monkeypatch.setattr(vnni_matmul, "SOURCE", source)
    first = _TINY.key()
    assert _TINY.key() == first  # nothing changed: the same key
    (tmp_path / "rows.h").write_text("// second\n")
    second = _TINY.key()
    source.write_text('#include "rows.h"\n// edited\n')
    assert len({first, second, _TINY.key()}) == 3

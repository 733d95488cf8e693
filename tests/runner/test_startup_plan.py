"""The start-up plan: every decision a rank runs with, made once from the config and the devices, reported as one
log block; the kernel fields of EngineConfig choose the CPU kernels (their old environment variables fill them in the
Python API only when the caller left them unset)."""

import dataclasses
import logging

import pytest

from jaxpaged.config import EngineConfig, kernel_options_from_environment
from jaxpaged.kernels.cpu_native.packed_matmul import packed_matmul_available
from jaxpaged.kernels.cpu_native.paged_decode import native_decode_available
from jaxpaged.runner import mesh as mesh_lib
from jaxpaged.runner.startup import StartupPlan, plan_startup

OPTIONS = dict(block_size=4, num_kv_blocks=32, max_model_len=64, max_num_batched_tokens=16, max_num_seqs=4,
               dtype="float32", attention_backend="xla")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from jaxpaged.weights.loader import load_model

    return load_model(str(tiny_model_dir))


def plan(loaded, **options) -> StartupPlan:
    config = EngineConfig.from_options(**{**OPTIONS, **options})
    return plan_startup(loaded.config, loaded.params, config, mesh_lib.rank_meshes(1, 1)[0])


def test_the_cpu_plan_unrolls_layers_and_uses_the_native_kernels_it_can_build(loaded, monkeypatch):
    monkeypatch.delenv("JAXPAGED_CPU_MATMUL", raising=False)
    monkeypatch.delenv("JAXPAGED_CPU_ATTENTION", raising=False)
    chosen = plan(loaded)
    assert (chosen.platform, chosen.per_layer, chosen.tensor_parallel_size) == ("cpu", True, 1)
    assert chosen.packed_weights == packed_matmul_available()
    assert chosen.native_decode == native_decode_available()
    assert (chosen.num_kv_blocks, chosen.memory.num_kv_blocks, chosen.kv_layout) == (32, 32, "interleaved")
    assert str(chosen.dtype) == "float32"


def test_the_kernel_fields_turn_the_native_kernels_off(loaded, monkeypatch):
    monkeypatch.delenv("JAXPAGED_CPU_MATMUL", raising=False)
    monkeypatch.delenv("JAXPAGED_CPU_ATTENTION", raising=False)
    chosen = plan(loaded, cpu_matmul="xla", cpu_attention="jnp")
    assert not chosen.packed_weights and not chosen.native_decode
    assert "matmuls: XLA dot; attention: xla\n" in chosen.describe() + "\n"


def test_the_kernel_variables_fill_only_the_kernel_fields_the_caller_left_unset():
    """The Python API reads JAXPAGED_CPU_MATMUL / JAXPAGED_CPU_ATTENTION for the fields it was not given (a given
    value wins, as a flag beats the environment on the command line); other variables are no kernel choice."""
    environ = {"JAXPAGED_CPU_MATMUL": "xla", "JAXPAGED_CPU_ATTENTION": "jnp", "JAXPAGED_MAX_MODEL_LEN": "64"}
    assert kernel_options_from_environment({}, environ) == dict(cpu_matmul="xla", cpu_attention="jnp")
    assert kernel_options_from_environment({"cpu_matmul": "native"}, environ) == dict(cpu_attention="jnp")
    assert kernel_options_from_environment({}, {"JAXPAGED_CPU_MATMUL": ""}) == {}
    with pytest.raises(ValueError, match="cpu_matmul: must be one of"):
        EngineConfig.from_options(**kernel_options_from_environment({}, {"JAXPAGED_CPU_MATMUL": "1"}))


def test_the_plan_reads_no_environment(loaded, monkeypatch):
    """The config alone decides: an exported kernel variable does not override a config the caller built."""
    monkeypatch.setenv("JAXPAGED_CPU_MATMUL", "xla")
    monkeypatch.setenv("JAXPAGED_CPU_ATTENTION", "jnp")
    chosen = plan(loaded, cpu_matmul="native", cpu_attention="native")
    assert chosen.packed_weights == packed_matmul_available()
    assert chosen.native_decode == native_decode_available()


def test_the_plan_is_frozen_and_refuses_a_pool_too_small_for_one_sequence(loaded):
    chosen = plan(loaded)
    with pytest.raises(dataclasses.FrozenInstanceError):
        chosen.num_kv_blocks = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_model_len: 64 tokens need 16 KV blocks"):
        plan(loaded, num_kv_blocks=8)


def test_bad_kernel_names_are_refused_by_the_config():
    with pytest.raises(ValueError, match="cpu_matmul: must be one of"):
        EngineConfig.from_options(cpu_matmul="blas")
    with pytest.raises(ValueError, match="cpu_attention: must be one of"):
        EngineConfig.from_options(cpu_attention="flash")


def test_a_runner_logs_its_plan_as_one_block(loaded, caplog):
    from jaxpaged.runner.model_runner import ModelRunner

    with caplog.at_level(logging.INFO, logger="jaxpaged.runner.startup"):
        runner = ModelRunner(loaded, EngineConfig.from_options(**OPTIONS))
    blocks = [record.getMessage() for record in caplog.records if "start-up plan" in record.getMessage()]
    assert len(blocks) == 1
    assert blocks[0] == runner.plan.describe() and "memory plan per device" in blocks[0]


def test_weight_loading_and_warm_up_show_progress_when_asked(loaded, capsys):
    """In a terminal (here: progress=True) the weights' placement and the warm-up compiles show a bar on stderr."""
    from jaxpaged.runner.model_runner import ModelRunner

    config = EngineConfig.from_options(**OPTIONS)
    runner = ModelRunner(loaded, config)
    mesh_lib.place_params(loaded.params, runner.model_config, runner.mesh, runner.dtype, progress=True)
    assert "Loading weights" in capsys.readouterr().err
    runner.warmup(sampler=False, progress=True)
    assert "Compiling" in capsys.readouterr().err

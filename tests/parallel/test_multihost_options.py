"""The multi-host options are engine options (config.MultiHostConfig): every command and LLM(...) take the same
flags, validated at construction with errors naming the option; none of this starts a job."""

import argparse

import pytest

from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
from jaxpaged.config import DEFAULT_DISTRIBUTED_TIMEOUT_S, EngineConfig, MultiHostConfig


def test_the_multi_host_flags_fill_the_multihost_group():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--coordinator-address", "10.0.0.1:8476", "--num-processes", "4", "--process-id", "3",
                              "--distributed-timeout", "5"])
    config = EngineConfig.from_options(**engine_options_from_args(args, environ={}))
    assert config.multihost == MultiHostConfig("10.0.0.1:8476", 4, 3, distributed_timeout=5.0)
    assert config.multihost.joins_job
    auto = EngineConfig.from_options(**engine_options_from_args(parser.parse_args(["--distributed"]), environ={}))
    assert auto.multihost.joins_job and auto.multihost.coordinator_address is None


def test_a_single_process_by_default():
    assert not EngineConfig().multihost.joins_job
    assert EngineConfig().multihost.distributed_timeout == DEFAULT_DISTRIBUTED_TIMEOUT_S


@pytest.mark.parametrize(("options", "field"), [
    (dict(coordinator_address="h:1"), "coordinator_address"),  # the three go together
    (dict(coordinator_address="h:1", num_processes=2), "coordinator_address"),
    (dict(coordinator_address="h:1", num_processes=0, process_id=0), "num_processes"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=2), "process_id"),
    (dict(coordinator_address="h:1", num_processes=2, process_id=-1), "process_id"),
    (dict(distributed_timeout=0), "distributed_timeout"),
    (dict(distributed="yes"), "distributed"),
])
def test_bad_multi_host_options_are_refused_by_name(options, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        EngineConfig.from_options(**options)

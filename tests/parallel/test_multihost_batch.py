"""The batch API on a multi-host job: the same script (tests/parallel/batch_worker.py) as 2 processes over gloo on
127.0.0.1 (one CPU device each, tp=2 across them). On a tiny Gemma 3 (sliding, full, sliding layers: three KV cache
groups) process 0's generate returns the single-process engine's tokens, greedy (with log-probabilities) and
seeded-sampled, token for token, and its memory plan keeps only each sliding layer's window; the follower's
generate returns []; and both exit 0 once the script ends, though it never closes the LLM. `jaxpaged generate`
prints the single-process text on process 0 only, and a killed follower ends process 0 with code 3. Every process
is killed at the end of its test, whatever happened.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

from jaxpaged.multihost.runtime import EXIT_FOLLOWER_LOST
from tests.conftest import TINY_LLAMA, save_tiny_llama
from tests.parallel import batch_worker
from tests.parallel.multihost_cluster import free_port

pytestmark = pytest.mark.xdist_group("multihost")  # the multi-process jobs take turns on the 2 cores

REPO_ROOT = Path(__file__).resolve().parents[2]
WINDOW = 8
"""The sliding layers' window: the longest prompt (46 tokens) is several windows long."""
GEMMA3 = TINY_LLAMA | dict(num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=16,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})
"""A tiny Gemma 3 with SmolLM2's vocabulary: full attention between two sliding layers (three groups of one layer)."""
JOB_TIMEOUT_S = 300
SLACK_S = 15.0
"""Scheduling noise on a loaded 2-core machine, on top of a documented bound."""


class JobResult(NamedTuple):
    """One process's exit code, standard output and the tail of its standard error."""

    code: int
    stdout: str
    stderr: str


class Job:
    """One process per command, started at once; close() kills whatever still runs."""

    def __init__(self, commands: list[list[str]], tmp_path: Path) -> None:
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1",
                   PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        self.outs = [tmp_path / f"process{i}.out" for i in range(len(commands))]
        self.errs = [tmp_path / f"process{i}.err" for i in range(len(commands))]
        self.processes: list[subprocess.Popen] = []
        for command, out_path, err_path in zip(commands, self.outs, self.errs):
            with open(out_path, "w") as out, open(err_path, "w") as err:
                self.processes.append(subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=REPO_ROOT))

    def wait(self, index: int, timeout_s: float) -> Optional[int]:
        """The process's exit code, or None if it still runs after timeout_s."""
        try:
            return self.processes[index].wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def result(self, index: int) -> JobResult:
        code = self.processes[index].returncode
        return JobResult(code, self.outs[index].read_text(), self.errs[index].read_text()[-3000:])

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait(30)


def run_job(commands: list[list[str]], tmp_path: Path) -> list[JobResult]:
    """Runs the commands as one job to its end (JOB_TIMEOUT_S); each process's result, in order."""
    job = Job(commands, tmp_path)
    try:
        for index in range(len(commands)):
            job.wait(index, JOB_TIMEOUT_S)
    finally:
        job.close()
    return [job.result(index) for index in range(len(commands))]


def worker_commands(model_dir: Path, outs: list[Path], *extra: str) -> list[list[str]]:
    coordinator = f"127.0.0.1:{free_port()}"
    return [[sys.executable, "-m", "tests.parallel.batch_worker", str(model_dir), coordinator, str(len(outs)),
             str(i), str(out), *extra] for i, out in enumerate(outs)]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-gemma3"), smollm2_tokenizer_dir, GEMMA3,
                           config_class="Gemma3TextConfig")


def single_process_outputs(model_dir: Path) -> dict:
    """The reference: the same requests on one process and one device (tp=1), KV cache groups on."""
    from jaxpaged.llm import LLM

    llm = LLM(str(model_dir), **batch_worker.ENGINE_OPTIONS)
    assert llm.engine.runner.plan.kv_spec.group_windows == (None, WINDOW, WINDOW)
    return batch_worker.run_requests(llm)


def test_spmd_generate_on_two_processes_equals_one_process(gemma3_dir, tmp_path):
    """A sliding-window model served by two processes keeps its KV cache groups: process 0 broadcasts every group's
    block tables and block copies, and the greedy tokens, their log-probabilities, the sampled tokens and a prefix
    hit are one process's."""
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    results = run_job(worker_commands(gemma3_dir, outs), tmp_path)
    for process_id, result in enumerate(results):
        assert result.code == 0, f"process {process_id} exited with {result.code}:\n{result.stderr}"
    leader, follower = (json.loads(out.read_text()) for out in outs)
    assert all(value == [] for value in follower.values()) and "memory_plan" not in follower, follower
    expected = single_process_outputs(gemma3_dir)
    assert [len(ids) for ids in leader["greedy"]] == [8] * len(batch_worker.PROMPT_LENS)
    for prompt_len, got, want in zip(batch_worker.PROMPT_LENS, leader["greedy"], expected["greedy"]):
        assert got == want, f"prompt of {prompt_len} tokens"
    for prompt_len, got, want in zip(batch_worker.PROMPT_LENS, leader["greedy_logprobs"], expected["greedy_logprobs"]):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5), f"prompt of {prompt_len} tokens"
    assert leader["sampled"] == expected["sampled"]
    assert leader["sampled"][0] != leader["greedy"][3], "the seeded request must really sample"
    # The longest prompt again: all but its last token hit (whole blocks, then the half-filled one copied in every
    # group: process 0 broadcasts the copies), and it generates its first answer.
    longest = batch_worker.PROMPT_LENS[-1]
    assert longest % batch_worker.BLOCK_SIZE != 1, "the prompt must end mid-block for the hit to need a copy"
    assert leader["again_cached"] == expected["again_cached"] == [longest - 1]
    assert leader["again"] == [leader["greedy"][-1]] == expected["again"]
    assert leader["again_logprobs"][0] == pytest.approx(expected["greedy_logprobs"][-1], rel=1e-4, abs=1e-5)
    # Hand-worked, per device at tp=2: a layer's page of a 4-token block is 4 x 1 KV head x 16 x (K, V) x 4 bytes
    # = 512 bytes; with three groups of one layer a block is one page, so 1 MiB holds 2048 blocks, and a 256-token
    # sequence holds 64 blocks in the full group and ceil(7 / 4) + 1 = 3 in each sliding one: 70 pages, 29 sequences.
    # Groups off, a block would be 3 pages (682 in 1 MiB) and a sequence 64 blocks = 192 pages: 10 sequences.
    assert leader["memory_plan"] == dict(group_windows=[None, WINDOW, WINDOW], bytes_per_block=512, num_kv_blocks=2048,
                                         blocks_per_sequence=70, max_sequences=29)


def test_generate_cli_on_two_processes_prints_the_one_process_text_on_process_0(tiny_model_dir, tmp_path):
    """`jaxpaged generate` run as the same command on every process: process 0 streams the single-process text,
    the follower prints nothing, and both exit 0."""
    from jaxpaged.llm import LLM
    from jaxpaged.sampling.params import SamplingParams

    coordinator = f"127.0.0.1:{free_port()}"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in batch_worker.ENGINE_OPTIONS.items()]
    prompt = "The capital of France is"
    results = run_job([[sys.executable, "-m", "jaxpaged.cli", "generate", prompt, "--max-tokens", "6",
                        "--temperature", "0.8", "--top-k", "50", "--seed-sample", "7", "--model", str(tiny_model_dir),
                        *flags, "-tp", "2", "--coordinator-address", coordinator, "--num-processes", "2",
                        "--process-id", str(i)] for i in range(2)], tmp_path)
    for process_id, result in enumerate(results):
        assert result.code == 0, f"process {process_id} exited with {result.code}:\n{result.stderr}"
    params = SamplingParams(temperature=0.8, top_k=50, seed=7, max_tokens=6)
    expected = LLM(str(tiny_model_dir), **batch_worker.ENGINE_OPTIONS).generate(prompt, params, use_tqdm=False)
    assert without_gloo_lines(results[0].stdout) == expected[0].outputs[0].text + "\n"
    assert without_gloo_lines(results[1].stdout) == ""


def without_gloo_lines(stdout: str) -> str:
    """Standard output less the lines gloo's C++ prints there itself ("[Gloo] Rank 0 is connected to ...")."""
    return "".join(line for line in stdout.splitlines(keepends=True) if not line.startswith("[Gloo]"))


def test_a_killed_follower_ends_process_0_with_code_3(tiny_model_dir, tmp_path):
    """Mid-generate, a dead follower fails process 0's next collective (or its watchdog, after the timeout): process
    0 exits with EXIT_FOLLOWER_LOST instead of hanging or carrying on."""
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    job = Job(worker_commands(tiny_model_dir, outs, "forever"), tmp_path)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all(out.exists() for out in outs):
            for index in range(2):
                assert job.processes[index].poll() is None, job.result(index)
            assert time.monotonic() < deadline, "the job never got going"
            time.sleep(0.5)
        time.sleep(1.0)  # well into the generate loop
        job.processes[1].kill()
        code = job.wait(0, batch_worker.DISTRIBUTED_TIMEOUT_S + SLACK_S)
        assert code == EXIT_FOLLOWER_LOST, job.result(0) if code is not None else "process 0 still runs"
    finally:
        job.close()

"""The batch API on a multi-host job: the same script (tests/parallel/batch_worker.py) as 2 processes over gloo on
127.0.0.1 (one CPU device each, tp=2 across them). Process 0's generate returns the single-process engine's tokens,
greedy and seeded-sampled, token for token; the follower's returns []; and both exit 0 once the script ends,
though it never closes the LLM. Every process is killed at the end of its test, whatever happened.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.parallel import batch_worker
from tests.parallel.multihost_cluster import free_port

pytestmark = pytest.mark.xdist_group("multihost")  # the multi-process jobs take turns on the 2 cores

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 300


class JobResult(NamedTuple):
    """One process's exit code, standard output and the tail of its standard error."""

    code: int
    stdout: str
    stderr: str


def run_job(command_of, num_processes: int, tmp_path: Path) -> list[JobResult]:
    """Starts `command_of(process_id)` as each process of one job and waits for all of them (JOB_TIMEOUT_S)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    outs = [tmp_path / f"process{i}.out" for i in range(num_processes)]
    errs = [tmp_path / f"process{i}.err" for i in range(num_processes)]
    processes: list[subprocess.Popen] = []
    try:
        for process_id in range(num_processes):
            with open(outs[process_id], "w") as out, open(errs[process_id], "w") as err:
                processes.append(subprocess.Popen(command_of(process_id), stdout=out, stderr=err, env=env,
                                                  cwd=REPO_ROOT))
        codes = [process.wait(JOB_TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        for process in processes:
            process.wait(30)
    return [JobResult(code, out.read_text(), err.read_text()[-3000:]) for code, out, err in zip(codes, outs, errs)]


def single_process_tokens(model_dir: Path) -> dict[str, list[list[int]]]:
    """The reference: the same requests on one process and one device (tp=1)."""
    from jaxpaged.llm import LLM

    llm = LLM(str(model_dir), **batch_worker.ENGINE_OPTIONS)
    greedy = llm.generate(batch_worker.prompts(), batch_worker.greedy_params(), use_tqdm=False)
    sampled = llm.generate(batch_worker.prompts()[3], batch_worker.sampled_params(), use_tqdm=False)
    return {"greedy": batch_worker.token_ids(greedy), "sampled": batch_worker.token_ids(sampled)}


def test_spmd_generate_on_two_processes_equals_one_process(tiny_model_dir, tmp_path):
    coordinator = f"127.0.0.1:{free_port()}"
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    results = run_job(lambda i: [sys.executable, "-m", "tests.parallel.batch_worker", str(tiny_model_dir),
                                 coordinator, "2", str(i), str(outs[i])], 2, tmp_path)
    for process_id, result in enumerate(results):
        assert result.code == 0, f"process {process_id} exited with {result.code}:\n{result.stderr}"
    leader, follower = (json.loads(out.read_text()) for out in outs)
    assert follower == {"greedy": [], "sampled": []}
    expected = single_process_tokens(tiny_model_dir)
    assert [len(ids) for ids in leader["greedy"]] == [8] * len(batch_worker.PROMPT_LENS)
    for prompt_len, got, want in zip(batch_worker.PROMPT_LENS, leader["greedy"], expected["greedy"]):
        assert got == want, f"prompt of {prompt_len} tokens"
    assert leader["sampled"] == expected["sampled"]
    assert leader["sampled"][0] != leader["greedy"][3], "the seeded request must really sample"


def test_generate_cli_on_two_processes_prints_the_one_process_text_on_process_0(tiny_model_dir, tmp_path):
    """`jaxpaged generate` run as the same command on every process: process 0 streams the single-process text,
    the follower prints nothing, and both exit 0."""
    from jaxpaged.llm import LLM
    from jaxpaged.sampling.params import SamplingParams

    coordinator = f"127.0.0.1:{free_port()}"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in batch_worker.ENGINE_OPTIONS.items()]
    prompt = "The capital of France is"
    results = run_job(lambda i: [sys.executable, "-m", "jaxpaged.cli", "generate", prompt, "--max-tokens", "6",
                                 "--temperature", "0.8", "--top-k", "50", "--seed-sample", "7",
                                 "--model", str(tiny_model_dir), *flags, "-tp", "2", "--coordinator-address",
                                 coordinator, "--num-processes", "2", "--process-id", str(i)], 2, tmp_path)
    for process_id, result in enumerate(results):
        assert result.code == 0, f"process {process_id} exited with {result.code}:\n{result.stderr}"
    params = SamplingParams(temperature=0.8, top_k=50, seed=7, max_tokens=6)
    expected = LLM(str(tiny_model_dir), **batch_worker.ENGINE_OPTIONS).generate(prompt, params, use_tqdm=False)
    assert without_gloo_lines(results[0].stdout) == expected[0].outputs[0].text + "\n"
    assert without_gloo_lines(results[1].stdout) == ""


def without_gloo_lines(stdout: str) -> str:
    """Standard output less the lines gloo's C++ prints there itself ("[Gloo] Rank 0 is connected to ...")."""
    return "".join(line for line in stdout.splitlines(keepends=True) if not line.startswith("[Gloo]"))

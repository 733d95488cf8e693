"""Multi-host serving on one machine: `jaxpaged serve` as 2 processes (one CPU device each, gloo collectives,
tp=2 across them). Process 0's HTTP answers equal the single-process engine's; a follower that dies or hangs
makes process 0 fail the request in flight, answer 503 and exit with code 3 within the documented bound; a
follower whose leader is gone exits (code 4, or SIGABRT from JAX's coordination client). Two jobs, each closed
(killed) at the end of the module whatever happened: the tp=2 job serves its comparison and then has its follower
killed; the dp=2 x tp=2 job serves its comparison and then has its follower hung (a cluster start fewer each).
"""

import json
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from jaxpaged.multihost.runtime import EXIT_FOLLOWER_LOST, EXIT_LEADER_LOST
from jaxpaged.server.multihost import DRAIN_S
from tests.parallel.multihost_cluster import DISTRIBUTED_TIMEOUT_S, Cluster

pytestmark = pytest.mark.xdist_group("multihost")  # the two jobs take turns on the 2 cores

SHARED = "You are a helpful assistant. Answer briefly and politely, in English, with care. Question: "
PROMPTS = [SHARED + "what is two plus two?", "Hi", SHARED + "name a colour.", "The capital of France is"]
"""Two prompts longer than one 32-token step (chunked prefill) that share 5 blocks (prefix hits), two short."""
MAX_TOKENS = 10
SLACK_S = 15.0
"""Scheduling noise on a loaded 2-core machine, on top of each documented bound."""


def started_cluster(model_dir, log_dir, **layout: int) -> Iterator[Cluster]:
    """A 2-process job (layout: Cluster's devices_per_process, data_parallel_size), killed when it is done with."""
    job = Cluster(model_dir, 2, log_dir, **layout)
    try:
        job.wait_healthy()
        yield job
    finally:
        job.close()


@pytest.fixture(scope="module")
def serving_then_killed_cluster(tiny_model_dir, tmp_path_factory):
    """One job for the tp=2 comparison and, after it (file order), the killed follower, which ends the job."""
    yield from started_cluster(tiny_model_dir, tmp_path_factory.mktemp("tp2-then-killed"))


@pytest.fixture(scope="module")
def serving_then_hung_cluster(tiny_model_dir, tmp_path_factory):
    """Two processes of two devices each, dp=2 x tp=2, for its comparison and, after it (file order), the hung
    follower, which ends the job: the watchdog is the same whatever the layout, so it needs no job of its own."""
    yield from started_cluster(tiny_model_dir, tmp_path_factory.mktemp("dp2-tp2-then-hung"), devices_per_process=2,
                               data_parallel_size=2)


@pytest.fixture(scope="module")
def single_process_choices(tiny_model_dir) -> list[dict]:
    """reference_choices on the tiny model, computed once for the module's comparisons."""
    return reference_choices(tiny_model_dir)


def reference_choices(model_dir) -> list[dict]:
    """The single-process, single-device engine on the same prompts: text and top-5 logprobs per token."""
    from jaxpaged.llm import LLM
    from jaxpaged.sampling.params import SamplingParams
    from jaxpaged.server.openai.responses import token_text
    from tests.parallel.multihost_cluster import ENGINE_FLAGS

    options = {flag[2:].replace("-", "_"): value for flag, value in zip(ENGINE_FLAGS[::2], ENGINE_FLAGS[1::2])}
    options = {k: int(v) if v.isdigit() else v for k, v in options.items()}
    llm = LLM(str(model_dir), **options)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    choices = []
    for output in llm.generate(PROMPTS, params, use_tqdm=False):
        sample = output.outputs[0]
        assert sample.logprobs is not None
        top = [{token_text(llm.get_tokenizer(), token_id, lp): lp.logprob for token_id, lp in step.items()}
               for step in sample.logprobs]
        choices.append(dict(text=sample.text, top=top))
    return choices


def start_stream(base_url: str, events: list[str], first_event: threading.Event) -> threading.Thread:
    """A long streamed completion on its own thread; every SSE payload lands in `events`."""
    def read() -> None:
        body = {"prompt": "Hello", "max_tokens": 240, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=120) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                        first_event.set()
        except httpx.TransportError as error:
            events.append(f"transport error: {error}")
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first_event.wait(60), "the stream never started"
    return reader


def watch_health_until_exit(cluster: Cluster, bound_s: float) -> tuple[list[int], float, object]:
    """Polls /health until process 0 exits; the codes seen, seconds until exit and the exit code."""
    start, codes = time.monotonic(), []
    with httpx.Client(timeout=1) as client:  # one client: httpx.get builds an SSL context per call (~23 ms of CPU)
        while time.monotonic() - start < bound_s:
            try:
                codes.append(client.get(cluster.base_url + "/health").status_code)
            except httpx.TransportError:
                pass
            if cluster.processes[0].poll() is not None:
                break
            time.sleep(0.2)
    return codes, time.monotonic() - start, cluster.wait_exit(0, 5)


def test_tp2_over_two_processes_serves_what_one_process_serves(serving_then_killed_cluster, single_process_choices):
    cluster = serving_then_killed_cluster
    body = {"prompt": PROMPTS, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": 5}
    response = httpx.post(cluster.base_url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    served = sorted(response.json()["choices"], key=lambda choice: choice["index"])
    expected = single_process_choices
    for prompt, choice, reference in zip(PROMPTS, served, expected):
        assert choice["text"] == reference["text"], prompt
        for step, (got, want) in enumerate(zip(choice["logprobs"]["top_logprobs"], reference["top"])):
            assert got.keys() == want.keys(), (prompt, step)
            for token, logprob in want.items():
                assert got[token] == pytest.approx(logprob, rel=1e-4, abs=1e-5), (prompt, step, token)
    # Asked again, a long prompt reuses all but its last token (whole blocks, then a block copy that process 0
    # broadcasts: each process copies its own heads' K/V) and still gives the same answer and logprobs.
    again = httpx.post(cluster.base_url + "/v1/completions", json=body | {"prompt": PROMPTS[2]}, timeout=120).json()
    usage = again["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
    assert usage["prompt_tokens"] % 16 != 1, "the prompt must end mid-block for the hit to need a copy"
    assert again["choices"][0]["text"] == expected[2]["text"]
    for got, want in zip(again["choices"][0]["logprobs"]["top_logprobs"], expected[2]["top"]):
        for token, logprob in want.items():
            assert got[token] == pytest.approx(logprob, rel=1e-4, abs=1e-5)
    metrics = httpx.get(cluster.base_url + "/metrics").text
    hits = [line for line in metrics.splitlines() if line.startswith("jaxpaged_prefix_cache_hits")]
    assert hits and float(hits[0].split()[-1]) > 0, hits


def test_killed_follower_fails_the_stream_then_process_0_exits_3(serving_then_killed_cluster):
    cluster = serving_then_killed_cluster
    events: list[str] = []
    reader = start_stream(cluster.base_url, events, threading.Event())
    cluster.processes[1].kill()
    # A dead peer fails the next collective at once; then DRAIN_S of 503s.
    codes, seconds, exit_code = watch_health_until_exit(cluster, DRAIN_S + SLACK_S)
    reader.join(10)
    assert exit_code == EXIT_FOLLOWER_LOST, cluster.log_tail(0)
    assert 503 in codes, codes
    assert seconds < DRAIN_S + SLACK_S
    errors = [json.loads(event)["error"] for event in events if event.startswith("{\"error\"")]
    assert errors and errors[0]["code"] == "engine_unavailable", events[-3:]
    assert not any('"finish_reason":"length"' in event for event in events)  # it never finished normally


def test_dp2_x_tp2_over_two_processes_serves_what_one_process_serves(serving_then_hung_cluster,
                                                                    single_process_choices):
    """Two processes of two devices each, dp=2 x tp=2: each data-parallel rank spans both processes (one device
    of each), process 0 plans both ranks' steps; the answers are the single-device engine's."""
    body = {"prompt": PROMPTS, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    response = httpx.post(serving_then_hung_cluster.base_url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    served = [choice["text"] for choice in sorted(response.json()["choices"], key=lambda c: c["index"])]
    assert served == [choice["text"] for choice in single_process_choices]


def test_hung_follower_is_given_up_on_within_the_timeout(serving_then_hung_cluster):
    cluster = serving_then_hung_cluster
    events: list[str] = []
    reader = start_stream(cluster.base_url, events, threading.Event())
    cluster.processes[1].send_signal(signal.SIGSTOP)  # alive but silent: only the watchdog can tell
    codes, seconds, exit_code = watch_health_until_exit(cluster, DISTRIBUTED_TIMEOUT_S + DRAIN_S + SLACK_S)
    reader.join(10)
    assert exit_code == EXIT_FOLLOWER_LOST, cluster.log_tail(0)
    assert seconds >= DISTRIBUTED_TIMEOUT_S - 1  # it did wait for the hung process, as documented
    assert 503 in codes, codes
    assert any(event.startswith("{\"error\"") for event in events), events[-3:]
    # Woken up, the follower finds its leader gone and exits: with its own code when its next collective fails
    # first, or aborted by JAX's coordination client when that notices the lost service first. Never a hang.
    cluster.processes[1].send_signal(signal.SIGCONT)
    exit_code = cluster.wait_exit(1, 2 * DISTRIBUTED_TIMEOUT_S + SLACK_S)
    assert exit_code in (EXIT_LEADER_LOST, -signal.SIGABRT), (exit_code, cluster.log_tail(1))

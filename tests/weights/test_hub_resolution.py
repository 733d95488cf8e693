"""Hugging Face repo ids resolve through the HF cache (offline here: a fake cache laid out like the real one), and
every Hub failure becomes one clear `model: ...` ValueError."""

import argparse
import json
import pathlib
from typing import Optional

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
from jaxpaged.llm import LLM
from jaxpaged.sampling.params import SamplingParams
from jaxpaged.weights.hub import HUB_FILE_PATTERNS, looks_like_repo_id
from jaxpaged.weights.loader import load_model

REPO_ID = "org/name"
MAIN_COMMIT, V2_COMMIT = "a" * 40, "b" * 40
GENERATION_CONFIG = {"eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9, "do_sample": True}
V2_GENERATION_CONFIG = {"eos_token_id": 5, "top_k": 20}


def add_snapshot(cache: pathlib.Path, repo_id: str, ref: str, commit: str, model_dir: pathlib.Path,
                 generation_config: Optional[dict], with_weights: bool = True) -> pathlib.Path:
    """One snapshot in huggingface_hub's cache layout: models--org--name/{refs/<ref>, snapshots/<commit>/...}.

    Real snapshots hold symlinks into blobs/; symlinks straight to the model's files read the same way.
    """
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in model_dir.iterdir():
        if file.name == "generation_config.json" or (file.suffix == ".safetensors" and not with_weights):
            continue
        (snapshot / file.name).symlink_to(file)
    if generation_config is not None:
        (snapshot / "generation_config.json").write_text(json.dumps(generation_config))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch) -> pathlib.Path:
    """An empty offline HF cache under a temporary HF_HOME; the process runs from a directory without "org/"."""
    home = tmp_path / "hf-home"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these environment variables once, at import; its functions read the constants.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    return cache


@pytest.fixture()
def cached_repo(hub_cache, tiny_model_dir) -> pathlib.Path:
    """org/name with main -> a snapshot of the tiny model, v2 -> a second one with another generation config."""
    add_snapshot(hub_cache, REPO_ID, "main", MAIN_COMMIT, tiny_model_dir, GENERATION_CONFIG)
    add_snapshot(hub_cache, REPO_ID, "v2", V2_COMMIT, tiny_model_dir, V2_GENERATION_CONFIG)
    return hub_cache


def test_repo_id_loads_from_the_cache_with_generation_config(cached_repo):
    loaded = load_model(REPO_ID)
    assert loaded.name == REPO_ID
    assert loaded.tokenizer_dir.name == MAIN_COMMIT
    assert loaded.config.eos_token_ids == (2, 7)
    assert loaded.generation_defaults == {"temperature": 0.6, "top_p": 0.9, "do_sample": True}
    assert "layers.q_proj" in loaded.params


def test_revision_selects_another_snapshot(cached_repo):
    by_ref = load_model(REPO_ID, revision="v2")
    assert by_ref.tokenizer_dir.name == V2_COMMIT
    assert by_ref.config.eos_token_ids == (5,)
    assert by_ref.generation_defaults == {"top_k": 20}
    by_commit = load_model(REPO_ID, revision=MAIN_COMMIT)
    assert by_commit.tokenizer_dir.name == MAIN_COMMIT


def test_llm_generates_from_a_repo_id(cached_repo):
    llm = LLM(REPO_ID, revision="main", dtype="float32", attention_backend="xla", max_model_len=64, max_num_seqs=2,
              max_num_batched_tokens=16, compilation_cache_dir="")
    assert llm.engine.model_name == REPO_ID
    assert llm.engine.eos_token_ids == [2, 7]
    output = llm.generate("Hello", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(output[0].outputs[0].token_ids) == 4
    # Requests without sampling settings get the model's (generation_config.json), as vLLM does.
    defaults = llm.engine.default_sampling_params()
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.6, 0.9, SamplingParams().top_k)


def test_server_fills_only_unset_sampling_fields_from_the_model():
    from jaxpaged.server.openai.protocol import CompletionRequest
    from jaxpaged.server.openai.validation import build_sampling_params

    model_defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    unset = CompletionRequest.model_validate({"prompt": "x"})
    params = build_sampling_params(unset, max_tokens=4, logprobs=None, vocab_size=100, max_n=4,
                                   model_defaults=model_defaults)
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.9, 20)
    explicit = CompletionRequest.model_validate({"prompt": "x", "temperature": 0.0, "top_k": 0})  # set: kept
    params = build_sampling_params(explicit, max_tokens=4, logprobs=None, vocab_size=100, max_n=4,
                                   model_defaults=model_defaults)
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 0.9, 0)
    plain = build_sampling_params(unset, max_tokens=4, logprobs=None, vocab_size=100, max_n=4)
    assert (plain.temperature, plain.top_p, plain.top_k) == (1.0, 1.0, 0)


def test_uncached_repo_offline_says_so(hub_cache):
    with pytest.raises(ValueError, match=r"^model: 'org/missing' is not in the Hugging Face cache .* HF_HUB_OFFLINE"):
        load_model("org/missing")


def test_unknown_revision_offline_says_so(cached_repo):
    with pytest.raises(ValueError, match=r"^model: 'org/name' \(revision 'nope'\) is not in the Hugging Face cache"):
        load_model(REPO_ID, revision="nope")


def test_snapshot_without_safetensors_says_convert(hub_cache, tiny_model_dir, monkeypatch):
    add_snapshot(hub_cache, "org/bin-only", "main", MAIN_COMMIT, tiny_model_dir, None, with_weights=False)
    with pytest.raises(ValueError, match=r"^model: .*'org/bin-only' has no safetensors files and HF_HUB_OFFLINE"):
        load_model("org/bin-only")
    # Online, snapshot_download has fetched every *.safetensors the repo has: none means the repo has none.
    snapshot = hub_cache / "models--org--bin-only" / "snapshots" / MAIN_COMMIT
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *args, **kwargs: str(snapshot))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ValueError, match=r"^model: .*'org/bin-only' has no safetensors weights.*convert it"):
        load_model("org/bin-only")


def test_revision_with_a_local_path_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match=r"^model: a revision \('v2'\) only applies to Hugging Face Hub ids"):
        load_model(str(tiny_model_dir), revision="v2")


def hub_response(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{REPO_ID}"))


HUB_ERRORS = [
    (GatedRepoError("403", response=hub_response(403)), "is a gated Hugging Face repo: accept its license.*HF_TOKEN"),
    (RepositoryNotFoundError("404", response=hub_response(404)), "neither a local path nor a Hugging Face repo"),
    (RevisionNotFoundError("404", response=hub_response(404)), "has no revision 'main': check --revision"),
    (IncompleteSnapshotError("partial", snapshot_path="/x"), "download of 'org/name' is incomplete.*network access"),
    (LocalEntryNotFoundError("no connection"), "cannot reach the Hugging Face Hub for 'org/name'.*check the network"),
    (OfflineModeIsEnabled("offline"), "cannot reach the Hugging Face Hub"),
    (httpx2.ConnectError("refused"), "cannot reach the Hugging Face Hub"),
    (HfHubHTTPError("401", response=hub_response(401)), "refused the access token.*HF_TOKEN"),
    (HfHubHTTPError("503", response=hub_response(503)), r"failed for 'org/name' \(HTTP 503\)"),
]


@pytest.mark.parametrize("error, message", HUB_ERRORS)
def test_each_hub_error_becomes_one_clear_value_error(monkeypatch, tmp_path, error, message):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="^model: .*" + message) as raised:
        load_model(REPO_ID)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_download_asks_only_for_the_files_jaxpaged_reads(monkeypatch, tmp_path):
    seen = {}

    def record(repo_id, **kwargs):
        seen.update(kwargs, repo_id=repo_id)
        raise RepositoryNotFoundError("404", response=hub_response(404))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", record)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError):
        load_model(REPO_ID, revision="v2")
    assert seen["repo_id"] == REPO_ID and seen["revision"] == "v2"
    assert seen["allow_patterns"] == HUB_FILE_PATTERNS
    for setting in ("cache_dir", "token", "local_files_only"):  # left to HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE
        assert setting not in seen


@pytest.mark.parametrize("model, expected", [
    ("org/name", True), ("gpt2", True), ("Org-1/Model_v2.5", True), ("./name", False), ("/abs/dir", False),
    ("~/models/x", False), ("a/b/c", False), ("model.gguf", False), ("org/name.safetensors", False),
    ("org/../name", False), ("org--x/name", False)])
def test_what_counts_as_a_repo_id(model, expected):
    assert looks_like_repo_id(model) is expected


def test_revision_flag_is_not_an_engine_option():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--model", REPO_ID, "--revision", "v2", "--max-num-seqs", "3"])
    assert (args.model, args.revision) == (REPO_ID, "v2")
    assert engine_options_from_args(args) == {"max_num_seqs": 3}

"""vLLM's --download-dir and --hf-token: a Hub model is looked up and downloaded in that directory with that token
(parsed and applied without starting a server, offline)."""

import argparse
import os

import pytest
from huggingface_hub import constants

from jaxpaged.cli import build_parser
from jaxpaged.server.config_file import parse_command_line
from jaxpaged.server.vllm.launch_flags import apply_download_flags
from jaxpaged.weights.hub import download_snapshot


def _args(*argv: str) -> argparse.Namespace:
    return parse_command_line(build_parser(), ["serve", *argv])


@pytest.fixture
def hub_env(monkeypatch):
    """The Hub's settings as the flags may change them, restored after the test; offline."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", constants.HF_HUB_CACHE)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _cached_snapshot(cache, repo_id: str, commit: str = "0" * 40):
    """A snapshot laid out as huggingface_hub caches one: refs/main naming a snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"")
    return snapshot


def test_download_dir_and_hf_token_reach_hugging_face(tmp_path, hub_env):
    """With --download-dir a Hub id resolves inside that directory, and --hf-token TOKEN is the token it uses."""
    snapshot = _cached_snapshot(tmp_path, "org/tiny")
    apply_download_flags(_args("org/tiny", "--download-dir", str(tmp_path), "--hf-token", "hf_secret"))
    assert os.environ["HF_TOKEN"] == "hf_secret"
    assert download_snapshot("org/tiny") == snapshot


def test_hf_token_without_a_value_keeps_the_stored_token(tmp_path, hub_env):
    """`--hf-token` alone means the token `hf auth login` stored: HF_TOKEN stays unset; no --download-dir leaves
    the cache where it was."""
    before = constants.HF_HUB_CACHE
    args = _args("org/tiny", "--hf-token")
    assert args.hf_token is True
    apply_download_flags(args)
    assert "HF_TOKEN" not in os.environ and constants.HF_HUB_CACHE == before

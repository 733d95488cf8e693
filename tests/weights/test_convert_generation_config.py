"""`jaxpaged convert` carries the source's generation_config.json into the converted checkpoint, so the converted
model stops on the same EOS ids and keeps the same sampling defaults as the source."""

import json
import shutil

import pytest

from jaxpaged.cli import main
from jaxpaged.weights.loader import load_model

GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                     "top_k": 20, "repetition_penalty": 1.05}


@pytest.fixture
def source_dir(tiny_model_dir, tmp_path):
    """A copy of the tiny HF checkpoint whose generation_config.json each test writes (or removes)."""
    return shutil.copytree(tiny_model_dir, tmp_path / "source")


def test_convert_writes_the_sources_generation_config(source_dir, tmp_path):
    (source_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    destination = tmp_path / "converted"
    assert main(["convert", str(source_dir), str(destination)]) == 0
    assert json.loads((destination / "generation_config.json").read_text()) == GENERATION_CONFIG
    converted, original = load_model(str(destination)), load_model(str(source_dir))
    assert converted.generation_defaults == original.generation_defaults
    assert converted.generation_defaults["temperature"] == 0.6 and converted.generation_defaults["top_k"] == 20
    assert converted.hf_config["eos_token_id"] == original.hf_config["eos_token_id"] == [2, 7]


def test_convert_writes_none_when_the_source_has_none(source_dir, tmp_path):
    (source_dir / "generation_config.json").unlink(missing_ok=True)
    destination = tmp_path / "converted"
    assert main(["convert", str(source_dir), str(destination)]) == 0
    assert not (destination / "generation_config.json").exists()
    assert load_model(str(destination)).generation_defaults == {}

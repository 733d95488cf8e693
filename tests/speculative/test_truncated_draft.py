"""The bench's draft builder: a target's first layers (or all), projections optionally int8, same tokenizer."""

import numpy as np
import pytest

from benchmarks.speculative.truncated_draft import write_truncated_draft
from jaxpaged.weights.loader import load_model


def test_the_draft_keeps_the_first_layers_and_the_shared_weights(tiny_model_dir, tmp_path):
    target = load_model(str(tiny_model_dir))
    draft = load_model(str(write_truncated_draft(str(tiny_model_dir), 1, tmp_path / "draft")))
    assert draft.config.num_layers == 1 and draft.config.vocab_size == target.config.vocab_size
    for name, value in target.params.items():
        expected = value[:1] if name.startswith("layers.") else value
        np.testing.assert_array_equal(draft.params[name], expected, err_msg=name)


def test_an_int8_draft_has_int8_projections_and_their_scales(tiny_model_dir, tmp_path):
    draft = load_model(str(write_truncated_draft(str(tiny_model_dir), None, tmp_path / "draft", "int8")))
    assert draft.config.num_layers == 2
    assert draft.params["layers.q_proj"].dtype == np.int8 and draft.params["layers.down_proj"].dtype == np.int8
    assert draft.params["embed"].dtype == np.float32  # the embedding (and tied head) stays float


def test_more_layers_than_the_target_has_are_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="^layers: must be in \\[1, 2\\]"):
        write_truncated_draft(str(tiny_model_dir), 3, tmp_path / "draft")

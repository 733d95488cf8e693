"""The tokenizer an engine uses: the model's own, or another one named by the `tokenizer` option (vLLM's
--tokenizer), read offline from a local directory or the local Hugging Face cache."""

import os
import pathlib
from typing import Any, Optional, Union

from transformers import PreTrainedTokenizerFast


def load_tokenizer(model_tokenizer_dir: Union[str, pathlib.Path], override: Optional[str] = None) -> Any:
    """The model's PreTrainedTokenizerFast (typed Any, as transformers' own loaders are), or `override`: a directory
    of HF tokenizer files, or a Hub repo id already in the HF cache (nothing is downloaded); ValueError naming the
    option when the override cannot be read."""
    if override is None:
        return PreTrainedTokenizerFast.from_pretrained(str(model_tokenizer_dir))
    path = pathlib.Path(os.path.expanduser(override))
    try:
        if path.is_dir():
            return PreTrainedTokenizerFast.from_pretrained(str(path))
        # NOTE: offline on purpose: a serve command should not start downloading a second repo.
        return PreTrainedTokenizerFast.from_pretrained(override, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"tokenizer: cannot load {override!r} (a directory with tokenizer.json, or a Hugging Face "
                         f"repo id already in the local cache): {type(error).__name__}") from None

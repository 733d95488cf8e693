"""Hugging Face Hub model ids: download (or find in the HF cache) the files jaxpaged reads, nothing more.

huggingface_hub reads HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE / HF_TOKEN / HF_ENDPOINT itself, so nothing here
passes a cache directory, token or offline flag: the user's environment decides. Every failure becomes one
ValueError starting with "model: " that says what went wrong and what to do, since the CLI and server print
such errors as a single line.
"""

import pathlib
import re
from typing import Optional

HUB_FILE_PATTERNS = [
    "config.json", "generation_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "tokenizer.model",
    "*.safetensors", "*.safetensors.index.json",
]
# Top-level files only (jaxpaged never reads subfolders: Llama's original/, onnx/ exports ...), and not Mistral's
# consolidated.safetensors, a second full copy of the weights under names jaxpaged does not read.
_IGNORE_PATTERNS = ["*/*", "consolidated*.safetensors"]

# "name" or "org/name": each part up to 96 ASCII letters, digits, '-', '_', '.', starting with a letter or digit.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")
_FILE_SUFFIXES = (".gguf", ".safetensors", ".json", ".bin")


def looks_like_repo_id(model: str) -> bool:
    """Whether `model`, not being an existing path, should be looked up on the Hub.

    Strings that can only be paths (./x, /x, ~/x, a/b/c, x.gguf) are not: a typo in a local path then says
    "does not exist" rather than "no such Hub repo".
    """
    return (bool(_REPO_ID.fullmatch(model)) and not model.endswith(_FILE_SUFFIXES)
            and ".." not in model and "--" not in model)


def download_snapshot(repo_id: str, revision: Optional[str] = None) -> pathlib.Path:
    """The local snapshot directory of `repo_id` at `revision` (None: the default branch), downloading what is
    missing; ValueError (see the module doc) when that is impossible or the repo has no usable weights."""
    import huggingface_hub  # only Hub ids pay for the import
    from huggingface_hub import constants

    try:
        path = pathlib.Path(huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=HUB_FILE_PATTERNS, ignore_patterns=_IGNORE_PATTERNS))
    except Exception as error:  # whatever the cause, the user gets one line (explain_hub_error), not a traceback
        raise ValueError(explain_hub_error(error, repo_id, revision)) from None
    has_config, has_weights = (path / "config.json").is_file(), any(path.glob("*.safetensors"))
    if not (has_config and has_weights) and constants.HF_HUB_OFFLINE:
        # Offline, the cache may hold only what another tool fetched (a tokenizer, say): nothing says the repo
        # lacks the file.
        raise ValueError(f"model: the cached snapshot of {repo_id!r} has no "
                         f"{'config.json' if not has_config else 'safetensors files'} and HF_HUB_OFFLINE is set, so "
                         "nothing was downloaded: run once online, or unset HF_HUB_OFFLINE")
    if not has_config:
        raise ValueError(f"model: the Hugging Face repo {repo_id!r} has no config.json at the top level; "
                         "jaxpaged loads transformers-format repos (config.json + *.safetensors)")
    if not has_weights:
        raise ValueError(f"model: the Hugging Face repo {repo_id!r} has no safetensors weights (only other formats, "
                         "such as pytorch_model.bin or .gguf); convert it to safetensors (transformers' "
                         "save_pretrained(dir, safe_serialization=True)) and pass that directory, or download a "
                         ".gguf file and pass its path")
    return path


def explain_hub_error(error: Exception, repo_id: str, revision: Optional[str]) -> str:
    """One line saying which of the known failures `error` is and what to do about it."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        DisabledRepoError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id!r}" + (f" (revision {revision!r})" if revision else "")
    if isinstance(error, GatedRepoError):  # before RepositoryNotFoundError: it is a subclass
        return (f"model: {where} is a gated Hugging Face repo: accept its license on "
                f"https://huggingface.co/{repo_id} and set HF_TOKEN to an access token of that account")
    if isinstance(error, RepositoryNotFoundError):
        return (f"model: {repo_id!r} is neither a local path nor a Hugging Face repo: check the path or the id "
                "(a private repo also needs HF_TOKEN set to a token that can read it)")
    if isinstance(error, RevisionNotFoundError):
        return (f"model: the Hugging Face repo {repo_id!r} has no revision {revision or 'main'!r}: check --revision "
                "(a branch, tag or commit hash)")
    if isinstance(error, DisabledRepoError):
        return f"model: the Hugging Face repo {repo_id!r} has been disabled by its owner"
    if isinstance(error, HFValidationError):
        return f"model: {repo_id!r} is neither a local path nor a valid Hugging Face repo id ({error})"
    if isinstance(error, IncompleteSnapshotError):  # before LocalEntryNotFoundError: it is a subclass
        return (f"model: the cached download of {where} is incomplete and the Hub cannot be reached: "
                "run once with network access to finish it")
    if isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled)) and constants.HF_HUB_OFFLINE:
        return (f"model: {where} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                "is set: run once online to download it, or unset HF_HUB_OFFLINE")
    if isinstance(error, (LocalEntryNotFoundError, ConnectionError, TimeoutError)) or _is_transport_error(error):
        return (f"model: cannot reach the Hugging Face Hub for {where} and it is not (completely) in the cache "
                f"({constants.HF_HUB_CACHE}): check the network (or HF_ENDPOINT), or download it once where the "
                "Hub is reachable and set HF_HUB_CACHE to that cache")
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code
        if status == 401:
            return (f"model: the Hugging Face Hub refused the access token for {where} (401): check HF_TOKEN, or "
                    "unset it for a public repo")
        return f"model: the Hugging Face Hub failed for {where} (HTTP {status}): try again later"
    return f"model: downloading {where} from the Hugging Face Hub failed: {type(error).__name__}: {error}"


def _is_transport_error(error: Exception) -> bool:
    """A connection-level failure of huggingface_hub's HTTP client (httpx2), which is not an OSError.

    Matched by module so jaxpaged does not import huggingface_hub's HTTP client itself.
    """
    return any(cls.__module__.split(".")[0] in ("httpx", "httpx2") and cls.__name__ == "TransportError"
               for cls in type(error).__mro__)

"""How the one-shot measurement scripts report: the figures as JSON on stdout, and in a file when asked."""

import json
import pathlib
from typing import Any, Optional, Union


def print_json(result: dict[str, Any], out: Optional[Union[str, pathlib.Path]] = None, indent: int = 1) -> None:
    """Print `result` as JSON; also write it to `out` (its folder created) when given."""
    text = json.dumps(result, indent=indent)
    print(text)
    if out:
        path = pathlib.Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

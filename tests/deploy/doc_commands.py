"""The shell commands of the deploy docs' code blocks, split into words, and the `jaxpaged` invocations inside them
(also those nested in a quoted `--command="..."`, as `gcloud ... ssh` takes them)."""

import pathlib
import re
import shlex

SUBCOMMANDS = ("serve", "generate", "bench", "convert", "advise")
_SEPARATORS = ("&&", "||", ";", "|")
_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def shell_blocks(markdown: str) -> list[str]:
    """The bodies of the ```bash / ```sh / ```shell code blocks."""
    return [body for language, body in _FENCE.findall(markdown) if language in ("bash", "sh", "shell")]


def command_lines(block: str) -> list[list[str]]:
    """Each command of a block as words: backslash continuations joined, comments dropped."""
    commands, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            commands.append(words)
    return commands


def _until_separator(words: list[str]) -> list[str]:
    for index, word in enumerate(words):
        if word in _SEPARATORS:
            return words[:index]
    return words


def jaxpaged_invocations(words: list[str]) -> list[list[str]]:
    """The argv (subcommand first) of every `jaxpaged SUBCOMMAND ...` in one command's words."""
    found = []
    for index, word in enumerate(words):
        if " " in word and "jaxpaged" in word:  # a quoted command line inside this one
            found += jaxpaged_invocations(shlex.split(word.partition("=")[2] if word.startswith("--") else word))
        elif (pathlib.PurePosixPath(word).name == "jaxpaged" and index + 1 < len(words)
              and words[index + 1] in SUBCOMMANDS):
            found.append(_until_separator(words[index + 1:]))
    return found

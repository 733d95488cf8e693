"""A small Dockerfile reader for the container tests: instructions grouped by build stage (no engine runs here)."""

import dataclasses
import json
import pathlib
import re


@dataclasses.dataclass
class Instruction:
    """One instruction, its continuation lines joined."""

    keyword: str
    """Upper case: FROM, RUN, COPY, ..."""
    arguments: str

    def exec_form(self) -> list[str]:
        """The JSON-array (exec) form's items; ValueError for the shell form."""
        value = json.loads(self.arguments)
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ValueError(f"{self.keyword} {self.arguments}: not a JSON array of strings")
        return value


@dataclasses.dataclass
class Stage:
    """One FROM and the instructions under it."""

    base: str
    name: str
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [instruction for instruction in self.instructions if instruction.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        if not found:
            raise AssertionError(f"stage {self.name!r} has no {keyword}")
        return found[-1]

    def env(self) -> dict[str, str]:
        """ENV's KEY=VALUE pairs (the form these files use)."""
        pairs = {}
        for instruction in self.all("ENV"):
            for item in instruction.arguments.split():
                key, _, value = item.partition("=")
                pairs[key] = value
        return pairs


def read_instructions(path: pathlib.Path) -> list[Instruction]:
    """The file's instructions: comments and blank lines dropped, backslash continuations joined."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        continued = stripped.endswith("\\")
        pending += " " + (stripped[:-1] if continued else stripped)
        if not continued:
            keyword, _, arguments = pending.strip().partition(" ")
            instructions.append(Instruction(keyword.upper(), " ".join(arguments.split())))
            pending = ""
    return instructions


def read_stages(path: pathlib.Path) -> list[Stage]:
    """The build stages in order (a FROM without AS is named by its index)."""
    stages: list[Stage] = []
    for instruction in read_instructions(path):
        if instruction.keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", instruction.arguments, re.IGNORECASE)
            if match is None:
                raise ValueError(f"{path}: cannot read FROM {instruction.arguments}")
            stages.append(Stage(match.group(1), match.group(2) or str(len(stages)), []))
        elif not stages:
            raise ValueError(f"{path}: {instruction.keyword} before the first FROM")
        else:
            stages[-1].instructions.append(instruction)
    return stages

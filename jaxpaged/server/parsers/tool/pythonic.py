"""pythonic: a Python list of calls with keyword arguments, `[get_weather(city="Paris"), get_time()]`, as Llama 3.2
and Llama 4 write them (Llama 4 inside `<|python_start|>` ... `<|python_end|>`)."""

import ast
from typing import Optional

from jaxpaged.server.parsers.tool.base import Call, ToolParser, arguments_text


class PythonicToolParser(ToolParser):
    """An answer that starts with `[` is a list of calls, read with Python's parser (never evaluated: only
    literals are accepted as argument values); anything else is content."""

    name = "pythonic"
    START, END = "<|python_start|>", "<|python_end|>"
    markers = (START,)
    opener = "["

    def parse_section(self, section: str) -> Optional[list[Call]]:
        body = section.replace(self.START, "").replace(self.END, "").strip()
        try:
            tree = ast.parse(body, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return None
            calls = []
            for node in tree.elts:
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                    return None
                arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords
                             if keyword.arg is not None}
                if len(arguments) != len(node.keywords):
                    return None  # **kwargs
                calls.append((node.func.id, arguments_text(arguments)))
            return calls
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return None

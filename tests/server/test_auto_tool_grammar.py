"""tool_choice "auto" with the hermes and llama3_json parsers: the grammar lets the model answer in text, or write
calls in the parser's format whose JSON names a declared tool with arguments matching its schema (hermes: after any
text, reasoning included; llama3_json: as the whole answer), and nothing else; checked token by token with the
embedded model's tokenizer and the engine's grammar compiler."""

import pytest
from transformers import PreTrainedTokenizerFast

from jaxpaged.sampling.grammar import GrammarCompiler
from jaxpaged.server.http.errors import APIError
from jaxpaged.server.openai.protocol import ChatCompletionRequest
from jaxpaged.server.openai.tool_calls import AUTO_TOOLS_ORIGIN, tool_calling
from jaxpaged.server.parsers.tool import make_tool_parser

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return PreTrainedTokenizerFast.from_pretrained(str(smollm2_tokenizer_dir))


LLAMA_WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
ALLOWED = {
    "hermes": ["It is sunny in Paris.", "<think>\nweather\n</think>\n\nSunny.", WEATHER,
               f"<think>\nI should call a tool.\n</think>\n\n{WEATHER}", f"Let me check.\n{WEATHER}\n{TIME}"],
    "llama3_json": ["It is sunny in Paris.", "Sunny {as} ever.", LLAMA_WEATHER,
                    f'{LLAMA_WEATHER}; {{"name": "get_time", "parameters": {{}}}}'],
}
REFUSED = {
    "hermes": ['<tool_call>\n{"name": "get_stock", "arguments": {}}\n</tool_call>',  # no such tool
               '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',  # not its schema
               "I will call <tool_call> later",  # a start tag must open a call
               f"{WEATHER} and some text after"],  # nothing but calls after the first one
    "llama3_json": ['{"name": "get_stock", "parameters": {}}', '{"name": "get_weather", "parameters": {"town": "x"}}',
                    "{not json", f"{LLAMA_WEATHER} and text", "Use <|python_tag|> here"],
}


@pytest.fixture(scope="module")
def auto_grammars(tokenizer) -> dict:
    """The compiled grammar a server with each parser puts on an "auto" request with TOOLS, by parser name."""
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                                                    "tool_choice": "auto"})
    compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id])
    grammars = {}
    for name in ALLOWED:
        calling = tool_calling(request, make_tool_parser(name))
        assert calling is not None
        constraint = calling.auto_constraint()
        assert constraint is not None and constraint.origin == AUTO_TOOLS_ORIGIN
        grammars[name] = compiler, compiler.compile(constraint)
    return grammars


def _verdict(auto_grammar: tuple, tokenizer, text: str) -> str:
    """'complete', 'open' (a valid prefix) or 'refused' for the grammar fed `text` token by token."""
    compiler, grammar = auto_grammar
    matcher = compiler.new_request_grammar(grammar)._matcher
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        matcher.consume_token(token_id)
        if matcher.is_error():
            return "refused"
    return "complete" if matcher.is_accepting() else "open"


@pytest.mark.parametrize("parser_name, text", [(name, text) for name, texts in ALLOWED.items() for text in texts])
def test_text_or_well_formed_calls_of_declared_tools_are_allowed(auto_grammars, tokenizer, parser_name, text):
    assert _verdict(auto_grammars[parser_name], tokenizer, text) == "complete"


@pytest.mark.parametrize("parser_name, text", [(name, text) for name, texts in REFUSED.items() for text in texts])
def test_malformed_or_undeclared_calls_are_refused(auto_grammars, tokenizer, parser_name, text):
    assert _verdict(auto_grammars[parser_name], tokenizer, text) == "refused"


@pytest.mark.parametrize("parser_name, opened", [("hermes", "<tool_call>"), ("llama3_json", '{"name": "get_weather"')])
def test_an_opened_call_is_not_an_answer(auto_grammars, tokenizer, parser_name, opened):
    assert _verdict(auto_grammars[parser_name], tokenizer, opened) == "open"


def test_formats_without_a_grammar_here_stay_unconstrained():
    request = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
                                                    "tool_choice": "auto"})
    for name in ("pythonic", "mistral", "deepseek_v3"):
        calling = tool_calling(request, make_tool_parser(name))
        assert calling is not None and calling.auto_constraint() is None, name


def test_tools_nested_too_deep_for_a_grammar_are_a_400_naming_tools():
    schema: dict = {"type": "string"}
    for _ in range(100):
        schema = {"type": "object", "properties": {"a": schema}}
    request = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto",
        "tools": [{"type": "function", "function": {"name": "deep", "parameters": schema}}]})
    calling = tool_calling(request, make_tool_parser("hermes"))
    assert calling is not None
    with pytest.raises(APIError) as refused:
        calling.auto_constraint()
    assert refused.value.param == "tools" and "nested deeper" in refused.value.message


def test_the_chat_route_puts_the_auto_grammar_on_unless_the_request_constrains_the_output():
    from jaxpaged.server.openai.chat import _tool_constraint

    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "auto"}
    request = ChatCompletionRequest.model_validate(body)
    constraint = _tool_constraint(request, tool_calling(request, make_tool_parser("hermes")))
    assert constraint is not None and constraint.origin == AUTO_TOOLS_ORIGIN
    own = ChatCompletionRequest.model_validate({**body, "structured_outputs": {"regex": "a+"}})
    assert _tool_constraint(own, tool_calling(own, make_tool_parser("hermes"))) is None  # its own wins
    assert _tool_constraint(request, tool_calling(request, make_tool_parser("pythonic"))) is None

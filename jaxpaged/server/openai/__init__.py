"""The OpenAI API on the engine: the request schemas (protocol.py) and their checks (validation.py), prompts and the
chat template, the endpoints (completions, chat completions, tokenize / detokenize), the engine requests behind one
HTTP request (generation.py), and the responses they become, whole or streamed as server-sent events, tool calls
included."""

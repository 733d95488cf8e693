"""The server's HTTP layer, below any endpoint: OpenAI-shaped error bodies (errors.py) and the guards every request
passes before a route sees it: bearer-token auth, the Host allow-list against DNS rebinding, and the deadlines on a
request's headers (a uvicorn protocol) and body (an ASGI middleware) that keep slow clients from holding sockets."""

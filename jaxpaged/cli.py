"""The `jaxpaged` command: serve | generate | bench | convert | advise."""

import argparse
import sys
from typing import Optional

from jaxpaged.cli_options import add_engine_arguments, engine_options_from_args
from jaxpaged.logging_setup import LOG_LEVELS, configure_logging


def _generate(args: argparse.Namespace) -> int:
    from jaxpaged.llm import LLM
    from jaxpaged.sampling.params import SamplingParams

    # Multi-host (--coordinator-address ... or --distributed): every process runs this same command; process 0
    # prints the text, the others run its steps and print nothing (multihost/batch.py).
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed_sample)
    with LLM(args.model, revision=args.revision, **engine_options_from_args(args)) as llm:
        prompt = args.prompt
        if args.chat:
            prompt = {"prompt_token_ids": list(llm.get_tokenizer().apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True, return_dict=False))}
        printed = None
        for output in llm.stream(prompt, params):
            text = output.outputs[0].text
            sys.stdout.write(text[printed or 0:])
            sys.stdout.flush()
            printed = len(text)
        if printed is not None:
            sys.stdout.write("\n")
    return 0


def _convert(args: argparse.Namespace) -> int:
    import pathlib

    from transformers import PreTrainedTokenizerFast

    from jaxpaged.weights.converted_store import save_converted
    from jaxpaged.weights.generation_config import read_generation_config
    from jaxpaged.weights.loader import load_model

    loaded = load_model(args.src)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(loaded.tokenizer_dir))
    # The source's directory (an HF checkpoint's own, a GGUF's conversion cache) holds its generation_config.json.
    save_converted(pathlib.Path(args.dst), loaded.hf_config, loaded.params, tokenizer, loaded.name,
                   read_generation_config(loaded.tokenizer_dir), quantization=loaded.quantization)
    print(f"wrote {args.dst} ({loaded.name}, {sum(v.size for v in loaded.params.values()):,} parameters)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from jaxpaged.server.launcher import serve_main

    return serve_main(args) or 0


def _bench(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `jaxpaged serve` and `generate` never load the sweep runner (jaxpaged/bench),
    # and the engine, LLM and the server never import it (tests/bench/test_bench_outside_product.py).
    from jaxpaged.bench.sweep import bench_main

    return bench_main(args) or 0


def _advise(args: argparse.Namespace) -> int:
    from jaxpaged.advise import advise_main

    return advise_main(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="jaxpaged", description="JAX paged-attention LLM inference engine")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_engine_arguments(serve)
    from jaxpaged.server.serve_flags import add_serve_arguments

    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)

    gen = commands.add_parser("generate", help="generate text for one prompt, streamed to the terminal")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    gen.add_argument("--top-k", type=int, default=0, help="top-k sampling (0: off)")
    gen.add_argument("--seed-sample", type=int, default=None, help="the request's sampling seed")
    gen.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="jaxpaged's log level, on stderr")
    add_engine_arguments(gen)
    gen.set_defaults(handler=_generate)

    bench = commands.add_parser("bench", help="run a benchmark sweep described by a YAML config")
    bench.add_argument("config", help="path of a configs/bench/*.yaml file")
    bench.add_argument("--out", default="results", help="directory for JSON, markdown and PNG results")
    bench.set_defaults(handler=_bench)

    convert = commands.add_parser("convert", help="convert a model to jaxpaged's Orbax checkpoint")
    convert.add_argument("src", help="HF checkpoint dir or .gguf file")
    convert.add_argument("dst", help="output directory")
    convert.set_defaults(handler=_convert)

    advise = commands.add_parser("advise", help="find prompt content the prefix cache misses and what to reorder")
    from jaxpaged.advise import add_advise_arguments

    add_advise_arguments(advise)
    advise.set_defaults(handler=_advise)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of the console script."""
    from jaxpaged.server.config_file import parse_command_line

    args = parse_command_line(build_parser(), argv)
    configure_logging(getattr(args, "log_level", "info"))
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"jaxpaged {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The engine's host path per step, phase by phase, at 64 / 256 / 512 running decode requests (issue 46).

What an accelerator waits for: scheduling, building the step's inputs and sending them, dispatching the sampler,
reading the sampled ids back, the scheduler's update, stops, detokenization, logprobs, the outputs and (the
server's way) handing them to the streams. The host path does not depend on the device, so it is measured on
the CPU: a real LLMEngine over a stub device whose step takes a fixed time without using the host's cores
(stub_device.py). Each phase is timed inside the engine (StepTimings); the device wait is not host work.

    python -m benchmarks.host_path --config configs/host_path.yaml [--out results/host_path]
    python -m benchmarks.host_path [--requests 64 256 512] [--steps 64] [--loop sync async]
                                   [--json-schema-fraction 0.1] [--n 2] [--logprobs 5] [--prefill-chunk 2048]
                                   [--stream] [--device-step-ms 2] [--json FILE]

Prints median (p90) ms of each phase per case; with --out also results.json, results.md and phases.png.
"""

import argparse
import itertools
import json
import pathlib
import sys
import time
from typing import Any, Optional

import yaml
from tqdm.auto import tqdm

from benchmarks.host_path import report
from benchmarks.host_path.cases import Case, run_case, summarize, tiny_model
from jaxpaged.bench.machine_info import machine_info


def cases_of_config(config: dict[str, Any]) -> list[Case]:
    """Every case the config's `cases` entries expand to (each entry: lists of requests and loops)."""
    cases = []
    for entry in config["cases"]:
        for loop, num_requests in itertools.product(entry.get("loop", ["sync", "async"]), entry["requests"]):
            cases.append(Case(num_requests, loop == "async", entry.get("json_schema_fraction", 0.0), entry.get("n", 1),
                              entry.get("prefill_chunk", 0), entry.get("logprobs"),
                              final_only=not entry.get("stream", False)))
    return cases


def cases_of_flags(args: argparse.Namespace) -> list[Case]:
    return [Case(num_requests, loop == "async", args.json_schema_fraction, args.n, args.prefill_chunk, args.logprobs,
                 final_only=not args.stream)
            for loop in args.loop for num_requests in args.requests]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=pathlib.Path, default=None, help="a configs/host_path.yaml file")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="results.json, results.md, phases.png here")
    parser.add_argument("--requests", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--loop", choices=("sync", "async"), nargs="+", default=["sync", "async"])
    parser.add_argument("--json-schema-fraction", type=float, default=0.0)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--logprobs", type=int, default=None)
    parser.add_argument("--prefill-chunk", type=int, default=0)
    parser.add_argument("--stream", action="store_true", help="the server's way: outputs every step, to streams")
    parser.add_argument("--device-step-ms", type=float, default=2.0,
                        help="how long the stub device's step takes (an accelerator's decode step)")
    parser.add_argument("--max-model-len", type=int, default=8192,
                        help="sizes each row of the block table the step sends (SmolLM2's context: 8192)")
    parser.add_argument("--json", dest="json_path", type=pathlib.Path, default=None, help="the results as JSON")
    args = parser.parse_args(argv)
    config: dict[str, Any] = yaml.safe_load(args.config.read_text()) if args.config else {}
    cases = cases_of_config(config) if config else cases_of_flags(args)
    num_steps = config.get("steps", args.steps)
    device_step_ms = config.get("device_step_ms", args.device_step_ms)
    max_model_len = config.get("max_model_len", args.max_model_len)
    model = tiny_model()
    results = []
    print(report.console_header())
    for case in tqdm(cases, desc="cases", unit="case", file=sys.stderr, leave=False):
        start = time.perf_counter()
        summary = summarize(run_case(model, case, num_steps, device_step_ms / 1e3, max_model_len))
        tqdm.write(report.console_row(case.label, summary), file=sys.stdout)
        results.append({"label": case.label, "case": case.__dict__, "summary_ms": summary,
                        "device_step_ms": device_step_ms, "seconds": time.perf_counter() - start})
    checks = report.check_targets(results, config.get("targets", {}))
    for line in checks:
        print(line)
    document = {"argv": sys.argv[1:], "config": config, "machine": machine_info(), "results": results,
                "targets": checks}
    if args.json_path:
        args.json_path.write_text(json.dumps(document, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(document, indent=1))
        (args.out / "results.md").write_text(report.markdown_table(results) + "\n" + "\n".join(checks) + "\n")
        report.plot(results, args.out / "phases.png", f"host path per step, stub device of {device_step_ms:g} ms")
        print(f"wrote {args.out}/results.json, results.md, phases.png")


if __name__ == "__main__":
    main()

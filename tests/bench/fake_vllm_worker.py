"""Stands in for vLLM in the vllm_cpu peer's tests: run by a fake bench python, it speaks vllm_worker.py's protocol
without vLLM. Each output token is the prompt's last token plus the position; FAKE_DIFFER_AT ("request:position,...")
shifts chosen tokens by one, so the agreement is known by hand. FAKE_ORDER_LOG gets a line per run; FAKE_CRASH
makes it exit before it is ready, printing that text."""

import json
import os
import sys

MARK = "@jaxpaged-peer "


def main() -> None:
    spec = json.loads(sys.argv[2])  # argv[1] is the real worker's path, which a fake python does not run
    print("INFO vLLM-like log line that is not an event", flush=True)
    if os.environ.get("FAKE_CRASH"):
        print(os.environ["FAKE_CRASH"], flush=True)
        sys.exit(1)
    print(MARK + json.dumps({"event": "ready", "load_s": 1.5, "version": f"fake-{spec['dtype']}"}), flush=True)
    items = [item for item in os.environ.get("FAKE_DIFFER_AT", "").split(",") if item]
    differ = {tuple(int(x) for x in item.split(":")) for item in items}
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        with open(os.environ.get("FAKE_ORDER_LOG", os.devnull), "a") as log:
            log.write(f"peer {len(command['prompts'])}\n")
        outputs = []
        for index, (prompt, max_tokens) in enumerate(zip(command["prompts"], command["max_tokens"])):
            tokens = [prompt[-1] + position + ((index, position) in differ) for position in range(max_tokens)]
            outputs.append({"token_ids": tokens, "first_token_s": 0.5 + index, "finish_s": 1.0 + index})
        print(MARK + json.dumps({"event": "run", "duration_s": 2.0, "outputs": outputs}), flush=True)


if __name__ == "__main__":
    main()

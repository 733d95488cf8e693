"""`jaxpaged advise`: groups timestamp-first helpdesk prompts apart from a chat group and a lone prompt, and prints
the reuse a reordering would bring, checked against a brute-force longest-common-run computation."""

import difflib
import json

from transformers import PreTrainedTokenizerFast

from jaxpaged.cli import main

HELPDESK = ("You are the helpdesk assistant of Example Corp. Answer politely and briefly. You can help with "
            "password resets, VPN access, printer problems, laptop orders and e-mail quotas. Never reveal internal "
            "ticket numbers. If a request needs a manager's approval, say so and give the approval form link "
            "https://intranet.example.com/forms/approval. Office hours are 8:00 to 18:00 on weekdays; outside them "
            "only security incidents are handled, by calling the on-call number. Always end with a short summary "
            "of what the user should do next, and ask whether anything else is needed. Keep answers under one "
            "hundred words unless the user asks for details.\n")
QUESTIONS = ["My printer on floor 3 jams every morning.", "How do I reset my password?",
             "Can I get a second monitor for my laptop?", "VPN disconnects every ten minutes, why?"]
TRANSLATOR = ("You translate English into French for the Example Corp newsletter. Keep names, product names and "
              "numbers unchanged, keep the tone of the source, and answer with the translation only.")
SENTENCES = ["The meeting starts at nine.", "Please send me the report.", "Our office moves next week."]


def helpdesk_prompt(i: int) -> str:
    return f"[2024-05-01 12:{10 + 7 * i:02d}:{31 + 5 * i:02d}] {HELPDESK}{QUESTIONS[i]}"


def write_prompts(path) -> None:
    lines = []
    for i in range(4):  # helpdesk prompts on lines 1, 3, 5, 7; chat prompts on 2, 4, 6; the lone one on 8
        lines.append(json.dumps({"prompt": helpdesk_prompt(i)}))
        if i < 3:
            lines.append(json.dumps({"messages": [{"role": "system", "content": TRANSLATOR},
                                                  {"role": "user", "content": SENTENCES[i]}]}))
    lines.append(json.dumps("A lone prompt about something else entirely, with nothing in common."))
    path.write_text("\n".join(lines) + "\n")


def expected_reuse(tokens: list[list[int]], block_size: int = 16) -> tuple[int, float]:
    """(earliest divergence, mean gain) by brute force: for each prompt after the first, its longest common prefix
    with an earlier one, then its longest common run after that prefix (difflib, exact) with an earlier one; the gain
    is the whole blocks the cached prefix would grow by if that run followed the prefix."""
    prefixes, gains = [], []
    for i in range(1, len(tokens)):
        a = tokens[i]
        prefix = max(next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                     for b in tokens[:i])
        run = max(difflib.SequenceMatcher(None, a, b, autojunk=False).find_longest_match(
            prefix, len(a), 0, len(b)).size for b in tokens[:i])
        prefixes.append(prefix)
        gains.append((prefix + run) // block_size * block_size - prefix // block_size * block_size)
    return min(prefixes), sum(gains) / len(gains)


def test_advise_groups_prompts_and_recommends_moving_the_timestamp(tiny_model_dir, tmp_path, capsys):
    path, png = tmp_path / "prompts.jsonl", tmp_path / "reuse.png"
    write_prompts(path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tiny_model_dir))
    diverge, reuse = expected_reuse([tokenizer.encode(helpdesk_prompt(i)) for i in range(4)])
    assert reuse > 100  # the body is ~130 tokens; only its partial last block is lost

    assert main(["advise", str(path), "--model", str(tiny_model_dir), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "8 prompts, 2 groups sharing content" in out and "(an assumption" in out
    helpdesk, chat = out.split("\n\ngroup ")[1:3]
    assert helpdesk.startswith("1: 4 prompts (lines 1, 3, 5, 7)")
    assert f"move the varying part at token {diverge}-" in helpdesk
    assert f"after the shared part: ~{reuse:.0f} tokens per request" in helpdesk
    assert f"~{reuse / 2000 * 1000:.1f} ms" in helpdesk  # at the default assumed 2000 tokens/s
    assert chat.startswith("2: 3 prompts (lines 2, 4, 6)")
    assert "recommendation: none, the shared part is already a common prefix" in chat
    assert "1 prompts share no long run with any other" in out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_advise_reports_a_bad_line(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n{"nope": 1}\n')
    assert main(["advise", str(path), "--model", str(tiny_model_dir)]) == 2
    assert "bad.jsonl:2: expected" in capsys.readouterr().err

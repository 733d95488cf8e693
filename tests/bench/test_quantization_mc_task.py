"""The local multiple-choice task the quantization quality guard scores with lm-eval: every question has four
distinct choices, exactly one of them the fact it asks for, at a position that varies; the files lm-eval reads."""

import json

from benchmarks.quantization.mc_task import CAPITALS, MONTHS, TASK_NAME, questions, write_task


def test_each_question_has_four_distinct_choices_and_its_fact_as_the_answer():
    items = questions()
    assert len(items) == 139
    for item in items:
        assert len(set(item["choices"])) == 4 and all(choice.startswith(" ") for choice in item["choices"])
    answers = {item["question"]: item["choices"][item["answer"]].strip() for item in items}
    assert answers["The capital of France is"] == CAPITALS["France"]
    assert answers["The month after December is"] == MONTHS[0]
    sums = [item for item in items if " plus " in item["question"]]
    for item in sums:
        a, _, b, _ = item["question"].split()
        assert int(item["choices"][item["answer"]]) == int(a) + int(b)
    assert len({item["answer"] for item in items}) == 4  # the answer is not always in one place
    assert questions() == items  # fixed seed: the same task every run


def test_write_task_writes_the_data_and_the_yaml_lm_eval_reads(tmp_path):
    write_task(tmp_path)
    lines = (tmp_path / "mc.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == questions()
    config = (tmp_path / f"{TASK_NAME}.yaml").read_text()
    assert f"task: {TASK_NAME}" in config and str(tmp_path / "mc.jsonl") in config
    assert "output_type: multiple_choice" in config

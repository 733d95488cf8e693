"""The local multiple-choice task the quantization quality guard scores with lm-eval: over 1,000 questions, every one
with four distinct choices, exactly one of them the fact it asks for, at a position that varies; the files lm-eval
reads."""

import collections
import json

from benchmarks.quantization.mc_tables import CAPITALS, MONTHS, PAST_TENSES
from benchmarks.quantization.mc_task import TASK_NAME, questions, write_task


def _answer(item: dict) -> str:
    return item["choices"][item["answer"]].strip()


def test_each_question_has_four_distinct_choices_and_its_fact_as_the_answer():
    items = questions()
    assert len(items) >= 1000
    assert len({item["question"] for item in items if item["family"] not in ("addition", "subtraction",
                                                                             "larger_number")}) > 300
    for item in items:
        assert len(set(item["choices"])) == 4 and all(choice.startswith(" ") for choice in item["choices"])
    answers = {item["question"]: _answer(item) for item in items}
    assert answers["The capital of France is"] == CAPITALS["France"] == "Paris"
    assert answers["The past tense of go is"] == PAST_TENSES["go"] == "went"
    assert answers["The month after December is"] == MONTHS[0] == "January"
    assert answers["October, November, December,"] == "January"
    assert answers["Saturday, Sunday, Monday,"] == "Tuesday"
    assert answers["W, X, Y,"] == "Z"
    assert answers["The plural of mouse is"] == "mice"
    assert answers["A baby cat is called a"] == "kitten"
    assert len({item["answer"] for item in items}) == 4  # the answer is not always in one place
    assert questions() == items  # fixed seed: the same task every run


def test_the_generated_families_answer_their_arithmetic():
    by_family = collections.defaultdict(list)
    for item in questions():
        by_family[item["family"]].append(item)
    for item in by_family["addition"]:
        a, _, b, _ = item["question"].split()
        assert int(_answer(item)) == int(a) + int(b)
    for item in by_family["subtraction"]:
        a, _, b, _ = item["question"].split()
        assert int(_answer(item)) == int(a) - int(b) >= 0
    for item in by_family["larger_number"]:
        a, b = (int(word.strip(",")) for word in item["question"].split()[1:4:2])
        assert int(_answer(item)) == max(a, b)
        assert f" {min(a, b)}" in item["choices"]  # the smaller one tempts
    for item in by_family["counting"]:
        first, second, third = (int(word) for word in item["question"].rstrip(",").split(", "))
        assert second - first == third - second and int(_answer(item)) == third + (third - second)
    assert all(len(family) >= 7 for family in by_family.values())


def test_write_task_writes_the_data_and_the_yaml_lm_eval_reads(tmp_path):
    write_task(tmp_path)
    lines = (tmp_path / "mc.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == questions()
    config = (tmp_path / f"{TASK_NAME}.yaml").read_text()
    assert f"task: {TASK_NAME}" in config and str(tmp_path / "mc.jsonl") in config
    assert "output_type: multiple_choice" in config and "target_delimiter: ''" in config


def test_lm_eval_scores_each_choice_after_one_space(tmp_path, monkeypatch):
    """The choices carry their leading space; lm-eval must not add its default delimiter (" ") before them."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    from lm_eval.tasks import TaskManager, get_task_dict

    write_task(tmp_path / "task")
    # include_defaults=False: the task needs none of lm-eval's own, and indexing them costs 7.5 s of CPU.
    task_manager = TaskManager(include_path=str(tmp_path / "task"), include_defaults=False)
    task = get_task_dict([TASK_NAME], task_manager)[TASK_NAME]
    task.build_all_requests(limit=1, rank=0, world_size=1)
    first = questions()[0]
    assert [instance.arguments for instance in task.instances] == [(first["question"], choice)
                                                                   for choice in first["choices"]]
    assert all(continuation.startswith(" ") and not continuation.startswith("  ")
               for _, continuation in (instance.arguments for instance in task.instances))

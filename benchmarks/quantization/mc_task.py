"""A local multiple-choice task for lm-evaluation-harness, written out from fact tables and generated families (no
data set download): capitals, opposites, plurals, past tenses, animal young and sounds, colours of common things,
small additions and subtractions, the larger of two numbers, counting, the next letter, weekday and month of a
sequence, the month after; 1,004 questions of 4 choices each, the answer's position and the distractors drawn with a
fixed seed. Easy for a large model; for a 135M one, a score well above chance (25%) in every family (34-100% for the
embedded SmolLM2-135M-Instruct in float32) that moves when its weights do, and enough questions that a paired
comparison resolves a point (paired_difference.py). Phrasings were chosen by what the small model answers: "C, D,
E," -> " F" (91%) where "The letter after E is" scored at chance."""

import json
import pathlib
import random
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.quantization import mc_tables as tables

TASK_NAME = "jaxpaged_quant_mc"

# (question, answer, distractor pool) before the choices are drawn.
Item = tuple[str, str, Sequence[str]]


def _choices(rng: random.Random, answer: str, pool: Sequence[str]) -> tuple[list[str], int]:
    """The answer and three other members of `pool`, shuffled; (choices with a leading space, answer index)."""
    others = sorted({item for item in pool if item != answer})  # sorted: a set's order is not fixed across runs
    choices = [answer, *rng.sample(others, 3)]
    rng.shuffle(choices)
    return [" " + choice for choice in choices], choices.index(answer)


def _near(answer: int) -> list[str]:
    """Distractors for a number: its neighbours within 3 that are not negative."""
    return [str(answer + d) for d in (-3, -2, -1, 1, 2, 3) if answer + d >= 0]


def _table(template: str, table: dict[str, str], pool: Sequence[str] | None = None) -> list[Item]:
    """One question per entry of `table`, `template` formatted with its key; distractors from the table's answers."""
    answers = list(pool if pool is not None else table.values())
    return [(template.format(key), value, answers) for key, value in table.items()]


def _additions(rng: random.Random, count: int) -> list[Item]:
    pairs = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(count)]
    return [(f"{a} plus {b} equals", str(a + b), _near(a + b)) for a, b in pairs]


def _subtractions(rng: random.Random, count: int) -> list[Item]:
    items = []
    for _ in range(count):
        a = rng.randint(5, 30)
        b = rng.randint(1, a - 1)
        items.append((f"{a} minus {b} equals", str(a - b), _near(a - b)))
    return items


def _larger(rng: random.Random, count: int) -> list[Item]:
    """The larger of two numbers: the smaller one is always a choice (the tempting one); two other numbers beside."""
    items = []
    for _ in range(count):
        a, b = rng.sample(range(1, 100), 2)
        others = rng.sample([n for n in range(1, 100) if n not in (a, b)], 2)
        pool = [str(min(a, b)), *map(str, others)]
        # A pool of exactly three: _choices draws all of them.
        items.append((f"Of {a} and {b}, the larger number is", str(max(a, b)), pool))
    return items


def _counting(rng: random.Random, count: int) -> list[Item]:
    """Continue a count: up by one, down by one or up by two, `count` of each from numbers below 200."""
    items: list[Item] = []
    for n in rng.sample(range(1, 97), count):
        items.append((f"{n}, {n + 1}, {n + 2},", str(n + 3), _near(n + 3)))
    for n in rng.sample(range(4, 100), count):
        items.append((f"{n}, {n - 1}, {n - 2},", str(n - 3), _near(n - 3)))
    for n in rng.sample(range(1, 97), count):
        items.append((f"{2 * n}, {2 * n + 2}, {2 * n + 4},", str(2 * n + 6), _near(2 * n + 6)))
    return items


def _sequence(names: Sequence[str], cyclic: bool) -> list[Item]:
    """Three consecutive members of `names` (wrapping round if `cyclic`: weekdays, months), then the next one."""
    size = len(names)
    starts = range(size) if cyclic else range(size - 3)
    return [(", ".join(names[(i + k) % size] for k in range(3)) + ",", names[(i + 3) % size], names) for i in starts]


def _month_after() -> list[Item]:
    months = tables.MONTHS
    return [(f"The month after {month} is", months[(i + 1) % 12], months) for i, month in enumerate(months)]


def families(rng: random.Random) -> dict[str, list[Item]]:
    """Every family's questions, before their choices are drawn; the generated ones draw their numbers from `rng`."""
    generated: dict[str, Callable[[], list[Item]]] = {
        "addition": lambda: _additions(rng, 250), "subtraction": lambda: _subtractions(rng, 200),
        "larger_number": lambda: _larger(rng, 100), "counting": lambda: _counting(rng, 25),
    }
    return {
        "capital": _table("The capital of {} is", tables.CAPITALS),
        "opposite": _table("The opposite of {} is", tables.OPPOSITES),
        "plural": _table("The plural of {} is", tables.PLURALS),
        "past_tense": _table("The past tense of {} is", tables.PAST_TENSES),
        "animal_young": _table("A baby {} is called a", tables.YOUNG),
        "animal_sound": _table("The {}", tables.SOUNDS),
        "colour": _table("{} is", {thing[0].upper() + thing[1:]: colour for thing, colour in tables.COLOURS.items()},
                         tables.COLOUR_NAMES),
        "letter_sequence": _sequence(tables.LETTERS, cyclic=False),
        "weekday_sequence": _sequence(tables.DAYS, cyclic=True),
        "month": _sequence(tables.MONTHS, cyclic=True) + _month_after(),
        **{name: make() for name, make in generated.items()},
    }


def questions(seed: int = 0) -> list[dict[str, Any]]:
    """Every question as {"question", "choices", "answer" (index), "family"}, family by family."""
    rng = random.Random(seed)
    out = []
    for family, items in families(rng).items():
        for question, answer, pool in items:
            choices, index = _choices(rng, answer, pool)
            out.append({"question": question, "choices": choices, "answer": index, "family": family})
    return out


def write_task(directory: pathlib.Path) -> None:
    """The task's data (mc.jsonl) and its lm-eval YAML into `directory` (pass it as the TaskManager's include_path)."""
    write_mc_task(directory, TASK_NAME, questions(), ("acc", "acc_norm"))


def write_mc_task(directory: pathlib.Path, name: str, items: list[dict[str, Any]], metrics: Sequence[str]) -> None:
    """A local lm-eval multiple-choice task `name`: `items` ({"question", "choices", "answer": index}) as mc.jsonl and
    the YAML that reads them, scored by `metrics`, into `directory`. The choices carry their own leading space, so
    the YAML sets an empty target_delimiter: lm-eval's default (" ") would score "  Paris", a lone space token
    before the word, text no model was trained to continue with."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "mc.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\n"
        "target_delimiter: ''\n"
        "metric_list:\n" + "".join(f"  - metric: {metric}\n" for metric in metrics))

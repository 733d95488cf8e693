"""A small local multiple-choice task for lm-evaluation-harness, written out from fact tables (no data set download):
capitals, opposites, additions, young animals, the next weekday and month; 139 questions of 4 choices each, the
answer's position and the distractors drawn with a fixed seed. Easy for a large model; for a 135M one, a score well
above chance (25%) that moves when its weights do."""

import json
import pathlib
import random
from collections.abc import Sequence
from typing import Any

TASK_NAME = "jaxpaged_quant_mc"

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon", "Japan": "Tokyo",
    "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "Greece": "Athens", "Canada": "Ottawa",
    "Australia": "Canberra", "India": "New Delhi", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
    "Mexico": "Mexico City", "Kenya": "Nairobi", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Poland": "Warsaw", "Austria": "Vienna", "Ireland": "Dublin",
    "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Switzerland": "Bern", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "South Korea": "Seoul", "Peru": "Lima", "Chile": "Santiago",
    "Colombia": "Bogota", "Cuba": "Havana", "Hungary": "Budapest", "the Czech Republic": "Prague", "Ukraine": "Kyiv",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "fast": "slow", "happy": "sad", "light": "dark", "old": "young",
    "early": "late", "open": "closed", "full": "empty", "rich": "poor", "hard": "soft", "high": "low", "wet": "dry",
    "strong": "weak", "long": "short", "thick": "thin", "loud": "quiet", "clean": "dirty", "win": "lose",
    "buy": "sell", "push": "pull", "first": "last", "day": "night", "true": "false", "good": "bad",
    "inside": "outside", "left": "right", "before": "after", "always": "never",
}
YOUNG = {"cat": "kitten", "dog": "puppy", "cow": "calf", "sheep": "lamb", "horse": "foal", "goat": "kid",
         "duck": "duckling", "frog": "tadpole", "bear": "cub", "kangaroo": "joey"}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def _choices(rng: random.Random, answer: str, pool: list[str]) -> tuple[list[str], int]:
    """The answer and three other members of `pool`, shuffled; (choices with a leading space, answer index)."""
    choices = [answer, *rng.sample([item for item in pool if item != answer], 3)]
    rng.shuffle(choices)
    return [" " + choice for choice in choices], choices.index(answer)


def questions(seed: int = 0) -> list[dict]:
    """Every question as {"question", "choices", "answer"}."""
    rng = random.Random(seed)
    items: list[tuple[str, str, list[str]]] = []
    items += [(f"The capital of {country} is", capital, list(CAPITALS.values())) for country, capital in
              CAPITALS.items()]
    items += [(f"The opposite of {word} is", opposite, list(OPPOSITES.values())) for word, opposite in
              OPPOSITES.items()]
    for _ in range(40):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        items.append((f"{a} plus {b} equals", str(a + b), [str(a + b + d) for d in (-3, -2, -1, 1, 2, 3)]))
    items += [(f"A baby {animal} is called a", young, list(YOUNG.values())) for animal, young in YOUNG.items()]
    items += [(f"The day after {day} is", DAYS[(i + 1) % 7], DAYS) for i, day in enumerate(DAYS)]
    items += [(f"The month after {month} is", MONTHS[(i + 1) % 12], MONTHS) for i, month in enumerate(MONTHS)]
    out = []
    for question, answer, pool in items:
        choices, index = _choices(rng, answer, pool)
        out.append({"question": question, "choices": choices, "answer": index})
    return out


def write_task(directory: pathlib.Path) -> None:
    """The task's data (mc.jsonl) and its lm-eval YAML into `directory` (pass it as the TaskManager's include_path)."""
    write_mc_task(directory, TASK_NAME, questions(), ("acc", "acc_norm"))


def write_mc_task(directory: pathlib.Path, name: str, items: list[dict[str, Any]], metrics: Sequence[str]) -> None:
    """A local lm-eval multiple-choice task `name`: `items` ({"question", "choices", "answer": index}) as mc.jsonl and
    the YAML that reads them, scored by `metrics`, into `directory`."""
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
        "metric_list:\n" + "".join(f"  - metric: {metric}\n" for metric in metrics))

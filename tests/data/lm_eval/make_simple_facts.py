"""Write simple_facts.jsonl: four-choice questions a small instruct model gets
partly right (opposites, colours, young animals, capitals, order of days and
months, counts, sums), for the local lm-eval task ``simple_facts``.

    python tests/data/lm_eval/make_simple_facts.py

(run it after editing the word lists; tests/unit/test_lm_eval_task.py checks that
the shipped file is its output).

Deterministic: the distractors of each item come from its own group's answers,
drawn with a fixed seed, and the correct choice's position rotates.
"""

import json
import random
from pathlib import Path

OPPOSITES = {
    "hot": "cold", "big": "small", "up": "down", "day": "night", "fast": "slow",
    "happy": "sad", "open": "closed", "wet": "dry", "light": "dark",
    "old": "young", "full": "empty", "early": "late", "hard": "soft",
    "loud": "quiet", "rich": "poor", "strong": "weak", "tall": "short",
    "thick": "thin", "win": "lose", "in": "out", "left": "right", "top": "bottom",
    "black": "white", "buy": "sell", "push": "pull", "first": "last",
}  # fmt: skip
COLOURS = {
    "the sky on a clear day": "blue", "fresh grass": "green", "snow": "white",
    "a ripe banana": "yellow", "coal": "black", "a ripe tomato": "red",
    "milk chocolate": "brown", "an orange": "orange", "a lemon": "yellow",
    "a lime": "green", "blood": "red", "the night sky": "black",
}  # fmt: skip
YOUNG = {
    "cat": "kitten", "dog": "puppy", "cow": "calf", "sheep": "lamb",
    "horse": "foal", "duck": "duckling", "frog": "tadpole", "bear": "cub",
    "goat": "kid", "swan": "cygnet", "kangaroo": "joey", "goose": "gosling",
}  # fmt: skip
CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin",
    "Spain": "Madrid", "Russia": "Moscow", "Egypt": "Cairo", "China": "Beijing",
    "Canada": "Ottawa", "Greece": "Athens", "Ireland": "Dublin",
    "Portugal": "Lisbon", "Norway": "Oslo", "Austria": "Vienna",
    "Poland": "Warsaw", "Kenya": "Nairobi", "Peru": "Lima", "Cuba": "Havana",
}  # fmt: skip
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
]  # fmt: skip
LEGS = {"a spider": 8, "a dog": 4, "a bird": 2, "an ant": 6, "a cat": 4,
        "a human": 2, "a horse": 4, "a beetle": 6, "an octopus": 8}  # fmt: skip
SIDES = {"a triangle": 3, "a square": 4, "a pentagon": 5, "a hexagon": 6,
         "an octagon": 8, "a rectangle": 4}  # fmt: skip
SEED = 20


def _item(rng: random.Random, question: str, answer: str, pool: list[str]) -> dict:
    """Three distractors from ``pool`` (never the answer), the answer placed
    at a random position."""
    others = sorted({p for p in pool if p != answer})
    choices = rng.sample(others, 3)
    position = rng.randrange(4)
    choices.insert(position, answer)
    return {"question": question, "choices": choices, "answer": position}


def _groups() -> list[tuple[str, str, list[str]]]:
    """(question, answer, distractor pool) for every item, in a fixed order."""
    opposites = list(OPPOSITES.values()) + list(OPPOSITES)
    items = [
        (f"What is the opposite of {w}?", a, opposites) for w, a in OPPOSITES.items()
    ]
    items += [(f"What colour is {t}?", c, [*COLOURS.values(), "purple"])
              for t, c in COLOURS.items()]  # fmt: skip
    items += [(f"What is a baby {a} called?", y, list(YOUNG.values()))
              for a, y in YOUNG.items()]  # fmt: skip
    items += [(f"What is the capital of {c}?", city, list(CAPITALS.values()))
              for c, city in CAPITALS.items()]  # fmt: skip
    items += [(f"Which day comes after {d}?", DAYS[(i + 1) % 7], DAYS)
              for i, d in enumerate(DAYS)]  # fmt: skip
    items += [(f"Which month comes after {m}?", MONTHS[(i + 1) % 12], MONTHS)
              for i, m in enumerate(MONTHS)]  # fmt: skip
    numbers = [str(n) for n in range(1, 19)]
    items += [
        (f"How many legs does {a} have?", str(n), numbers) for a, n in LEGS.items()
    ]
    items += [
        (f"How many sides does {s} have?", str(n), numbers) for s, n in SIDES.items()
    ]
    items += [(f"What is {a} + {b}?", str(a + b), numbers)
              for a in range(1, 10) for b in range(a, 10)]  # fmt: skip
    return items


def write(out: Path) -> int:
    """Write the items as JSON lines to ``out``; their number."""
    rng = random.Random(SEED)
    items = [_item(rng, q, a, pool) for q, a, pool in _groups()]
    out.write_text("".join(json.dumps(item) + "\n" for item in items))
    return len(items)


def main() -> None:
    out = Path(__file__).resolve().parent / "simple_facts.jsonl"
    print(f"{write(out)} items written to {out}")


if __name__ == "__main__":
    main()

"""Generic prompts whose continuations by SmolLM2 teach its draft model
(scripts/build_draft_model.py): prose, lists, code, counting and repeated
text in many forms. None is one of benchmarks/spec_decode.py's prompts, nor
its pattern with other words (no counting from 1 by 1 with commas, no days
of the week, no ``def add``/``def sub``, no cat on a mat): the draft must
earn its acceptance on text it never saw."""

import itertools

PROSE = [
    "Once upon a time, in a small village by the sea,",
    "The history of the printing press begins",
    "Water boils at 100 degrees Celsius because",
    "To make a cup of tea, first",
    "The most important thing about learning a language is",
    "In the morning, the market was already full of",
    "Photosynthesis is the process by which plants",
    "My favourite book is one that",
    "The train left the station at noon and",
    "Here are three tips for writing clear emails:",
    "The Roman Empire was one of the largest",
    "A good night's sleep helps the body",
    "The recipe calls for flour, sugar, eggs and",
    "When the storm finally passed, the villagers",
    "Computers store information as",
    "The moon orbits the Earth every",
    "She opened the old wooden box and found",
    "Exercise is good for your health because",
    "The capital of France is Paris, and the capital of",
    "Dear Sir or Madam, I am writing to",
    "The first step in solving any problem is",
    "Mountains are formed when",
    "In summary, the results of the experiment show that",
    "The library opens at nine o'clock and",
]

SENTENCES = [
    "The dog ran across the field.",
    "I like to read books in the evening.",
    "The sun rises in the east.",
    "We went to the park to play.",
    "Please close the door when you leave.",
    "The bird sang a happy song.",
    "It is raining again today.",
    "The red car stopped at the light.",
    "She drinks coffee every morning.",
    "The children laughed and played.",
]

LISTS = [
    ["January", "February", "March", "April", "May", "June", "July"],
    ["red", "orange", "yellow", "green", "blue", "indigo", "violet"],
    ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus"],
    ["spring", "summer", "autumn", "winter", "spring", "summer", "autumn"],
    ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J"],
    ["north", "east", "south", "west", "north", "east", "south"],
    ["dog", "cat", "horse", "cow", "sheep", "pig", "goat"],
    ["Spain", "France", "Italy", "Germany", "Poland", "Greece", "Portugal"],
    ["one", "two", "three", "four", "five", "six", "seven", "eight"],
    ["first", "second", "third", "fourth", "fifth", "sixth", "seventh"],
    ["I", "II", "III", "IV", "V", "VI", "VII", "VIII"],
    ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"],
    ["do", "re", "mi", "fa", "sol", "la", "ti", "do"],
    ["rock", "paper", "scissors", "rock", "paper", "scissors", "rock"],
]

SEPARATORS = [", ", " ", "\n", "; ", " - ", " | "]

FUNCTIONS = [
    ("square", "x * x"),
    ("cube", "x * x * x"),
    ("double", "x * 2"),
    ("half", "x / 2"),
    ("negate", "-x"),
    ("increment", "x + 1"),
]

CODE = [
    'config = {\n    "name": "server",\n    "port": 8080,\n    "host": "localhost",\n',
    "<ul>\n  <li>Home</li>\n  <li>About</li>\n  <li>Blog</li>\n",
    "SELECT name, age FROM users WHERE age > 30;\nSELECT name, city FROM",
    "for i in range(10):\n    print(i)\n\nfor j in range(5):\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "int main() {\n    int a = 1;\n    int b = 2;\n    int c = 3;\n",
    "import os\nimport sys\nimport json\nimport time\n",
    "x = [1, 2, 3]\ny = [4, 5, 6]\nz = [7, 8, 9]\n",
    "| Name | Age |\n|------|-----|\n| Alice | 30 |\n| Bob | 25 |\n",
    "if x > 0:\n    return 'positive'\nelif x < 0:\n",
]


def counting() -> list[str]:
    """Arithmetic series of other steps, starts and separators, countdowns,
    spelled-out and numbered forms, tables."""
    prompts = []
    for step, start in [(2, 2), (3, 3), (5, 5), (10, 10), (100, 100), (2, 1), (7, 7)]:
        for separator in [", ", " ", "\n"]:
            numbers = [str(start + step * i) for i in range(8)]
            prompts.append(separator.join(numbers) + separator.rstrip(" "))
    for start in [20, 50, 13]:
        numbers = [str(start - i) for i in range(8)]
        prompts.append(", ".join(numbers) + ",")
    for start in [40, 101, 2000]:
        prompts.append("\n".join(str(start + i) for i in range(6)) + "\n")
    for table in [2, 3, 7]:
        prompts.append("".join(f"{table} x {i} = {table * i}\n" for i in range(1, 5)))
    prompts.append("Step 1: open the box.\nStep 2: take out the parts.\nStep 3:")
    prompts.append("Chapter 1\nChapter 2\nChapter 3\nChapter")
    prompts.append("1. apples\n2. bread\n3. milk\n4.")
    prompts.append("a1 b2 c3 d4 e5 f6")
    return prompts


def repeated() -> list[str]:
    """A sentence twice, then the start of its third time."""
    prompts = []
    for sentence in SENTENCES:
        cut = " ".join(sentence.split()[:3])
        prompts.append(f"{sentence} {sentence} {cut}")
    return prompts


def lists() -> list[str]:
    """Each list with a few separators, cut after most of its items."""
    pairs = itertools.product(range(len(LISTS)), range(len(SEPARATORS)))
    prompts = []
    for index, (list_index, sep_index) in enumerate(pairs):
        if index % 2:  # half of the pairs: enough variety, half the cost
            continue
        items = LISTS[list_index]
        separator = SEPARATORS[sep_index]
        prompts.append(separator.join(items[:5]) + separator.rstrip(" "))
    return prompts


def code() -> list[str]:
    prompts = list(CODE)
    for (first, body1), (second, body2) in itertools.pairwise(FUNCTIONS):
        prompts.append(
            f"def {first}(x):\n    return {body1}\n\n"
            f"def {second}(x):\n    return {body2}\n\ndef"
        )
    return prompts


def draft_prompts() -> list[str]:
    return PROSE + counting() + repeated() + lists() + code()

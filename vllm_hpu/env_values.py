"""How a variable's text becomes its value: the parsers of ``envs.py``'s table,
each failing with the variable's name and what it accepts."""

from collections.abc import Callable
from typing import Any

Parser = Callable[[str, str], Any]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def invalid(name: str, raw: str, accepted: str) -> ValueError:
    return ValueError(f"{name}={raw!r} is not valid: {name} accepts {accepted}.")


def boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise invalid(name, raw, "one of " + "/".join(_TRUE + _FALSE))


def number(convert: type, accepts: Callable[[Any], bool], accepted: str) -> Parser:
    """A parser converting with ``convert`` and keeping values ``accepts`` allows."""

    def parse(name: str, raw: str) -> Any:
        try:
            value = convert(raw)
        except ValueError:
            raise invalid(name, raw, accepted) from None
        if not accepts(value):
            raise invalid(name, raw, accepted)
        return value

    return parse


positive_int = number(int, lambda v: v > 0, "a positive integer")
non_negative_int = number(int, lambda v: v >= 0, "an integer >= 0")
fraction = number(float, lambda v: 0.0 <= v <= 1.0, "a number between 0 and 1")
positive_float = number(float, lambda v: v > 0.0, "a positive number")


def choice(*choices: str) -> Parser:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise invalid(name, raw, "one of " + ", ".join(choices))
        return raw

    return parse


def text(name: str, raw: str) -> str:
    return raw

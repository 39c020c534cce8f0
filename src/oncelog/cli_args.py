"""Argument types the subcommands share. Each raises ``argparse.ArgumentTypeError``, so a bad value
is a usage error (exit code 2) whose message names the option and the value, before any work
starts. A leaf module: it imports nothing of ours, so every layer may use it."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence


def _converted(kind: Callable[[str], float], text: str, expected: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    """A finite number of ``kind`` (``int`` or ``float``) greater than 0 (``nan`` and ``inf`` are
    refused: ``nan <= 0`` is false, so a bare comparison let them through)."""
    def parse(text: str) -> float:
        value = _converted(kind, text, "a number")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value
    return parse


def at_least(low: int) -> Callable[[str], int]:
    """A whole number ``>= low``."""
    def parse(text: str) -> int:
        value = int(_converted(int, text, "a whole number"))
        if value < low:
            raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}" if low == 0
                                             else f"must be at least {low}, got {text!r}")
        return value
    return parse


#: A whole number >= 0.
count = at_least(0)


def probability(text: str) -> float:
    """A number in [0, 1)."""
    value = _converted(float, text, "a number")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text!r}")
    return value


def one_of(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """A comma-separated, non-empty list of names from ``choices``."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list from {', '.join(choices)}, got {text!r}")
        return names
    return parse

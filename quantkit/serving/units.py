"""Durations and SLOs as users write them on the command line: ``800ms``, ``0.5s``, ``2``
(seconds), and ``ttft=500ms,tpot=50ms,e2e=10s``."""

from __future__ import annotations

import re

from quantkit.errors import UserInputError
from quantkit.serving.stats import Slo

_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2e", "e2el": "e2e"}


def parse_duration(text: str, name: str) -> float:
    """Seconds from ``800ms``, ``0.5s`` or ``2``; a UserInputError naming ``name`` otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ms|us|s)?\s*", text.lower())
    if match is None:
        raise UserInputError(f"{name}: '{text}' is not a duration", f"e.g. {name} 800ms (or 0.8s, or 0.8)")
    value = float(match.group(1)) * _UNITS[match.group(2) or ""]
    if value <= 0:
        raise UserInputError(f"{name}: '{text}' must be positive", f"e.g. {name} 800ms")
    return value


def parse_slo(text: str) -> Slo:
    """``ttft=500ms,tpot=50ms,e2e=10s`` (any subset)."""
    values: dict[str, float] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        key, sep, value = part.partition("=")
        field = SLO_KEYS.get(key.strip().lower())
        if not sep or field is None:
            raise UserInputError(
                f"--slo: '{part}' is not KEY=DURATION with KEY one of ttft, tpot, e2e",
                "e.g. --slo ttft=500ms,tpot=50ms",
            )
        values[field] = parse_duration(value, f"--slo {key.strip()}")
    if not values:
        raise UserInputError("--slo is empty", "e.g. --slo ttft=500ms,tpot=50ms")
    return Slo(**values)


def parse_counts(text: str, name: str) -> list[int]:
    """``1,4,16`` -> [1, 4, 16] (positive integers)."""
    try:
        values = [int(piece) for piece in text.split(",") if piece.strip()]
    except ValueError:
        raise UserInputError(f"{name}: '{text}' is not a list of integers", f"e.g. {name} 1,4,16") from None
    if not values or any(v < 1 for v in values):
        raise UserInputError(f"{name}: '{text}' needs positive integers", f"e.g. {name} 1,4,16")
    return values

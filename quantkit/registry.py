"""One registry of quantization backends: name -> "module:Class", imported only when used."""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING

from quantkit.errors import RecipeError

if TYPE_CHECKING:
    from quantkit.backends.base import Backend

BACKENDS: dict[str, str] = {
    "awq": "quantkit.backends.awq:AWQBackend",
    "fp8": "quantkit.backends.fp8:FP8Backend",
    "gguf": "quantkit.backends.gguf:GGUFBackend",
    "gptq": "quantkit.backends.gptq:GPTQBackend",
    "rtn": "quantkit.backends.rtn:RTNBackend",
}


def backend_names() -> list[str]:
    """Registered backend names, sorted."""
    return sorted(BACKENDS)


def did_you_mean(name: str, choices: list[str]) -> str:
    """A 'did you mean X?' hint, or a list of valid choices when nothing is close."""
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    if close:
        return f"did you mean '{close[0]}'?"
    return "choose one of: " + ", ".join(choices)


def get_backend(name: str) -> type[Backend]:
    """Import and return the backend class registered under ``name``."""
    target = BACKENDS.get(name)
    if target is None:
        raise RecipeError(f"unknown method '{name}'", did_you_mean(name, backend_names()))
    module_name, _, class_name = target.partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return cls

"""Runtimes: how a model (the baseline, an artifact) is loaded, scored and timed.

Each implements ``quantkit.runtimes.base.Runtime`` and is registered by name in
``RUNTIMES``; artifacts name theirs in their ``runtime`` field.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantkit.errors import UserInputError
from quantkit.registry import Registry

if TYPE_CHECKING:
    from quantkit.runtimes.base import Runtime, RuntimeClass, RuntimeSettings

RUNTIMES: Registry[RuntimeClass] = Registry(
    "runtime",
    {
        "hf": "quantkit.runtimes.hf:HFRuntime",
        "llamacpp": "quantkit.runtimes.llamacpp:LlamaCppRuntime",
    },
    UserInputError,
    group="quantkit.runtimes",
)


def runtime_class(kind: str) -> RuntimeClass:
    """The runtime class registered as ``kind``."""
    return RUNTIMES.get(kind)


def open_runtime(kind: str, path: Path, settings: RuntimeSettings) -> Runtime:
    """Load ``path`` in the runtime registered as ``kind``."""
    return runtime_class(kind).load(path, settings)

"""Runtimes: how an artifact (or the baseline) is loaded and scored.

A runtime needs little more than ``log_probs(ids) -> [B, L, vocab]`` and ``close()``;
evaluators never see a backend. Runtimes are named by the artifact's ``runtime`` field.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError

RUNTIMES: dict[str, str] = {
    "hf": "quantkit.runtimes.hf:HFRuntime",
    "llamacpp": "quantkit.runtimes.llamacpp:LlamaCppRuntime",
}


def open_runtime(kind: str, path: Path, device: str, **options: Any) -> Any:
    """Load ``path`` in the runtime registered as ``kind`` (options: context_length, ...)."""
    target = RUNTIMES.get(kind)
    if target is None:
        raise QuantkitError(f"no runtime '{kind}' to run this artifact", "choices: " + ", ".join(RUNTIMES))
    module_name, _, class_name = target.partition(":")
    runtime_cls = getattr(importlib.import_module(module_name), class_name)
    return runtime_cls(path, device, **options)

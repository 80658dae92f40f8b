"""Quantization backends, one module each, registered by method name in ``BACKENDS``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantkit.errors import RecipeError
from quantkit.registry import Registry

if TYPE_CHECKING:
    from quantkit.backends.base import Backend, BackendOptions

BACKENDS: Registry[type[Backend[BackendOptions]]] = Registry(
    "method",
    {
        "autoround": "quantkit.backends.autoround:AutoRoundBackend",
        "awq": "quantkit.backends.awq:AWQBackend",
        "external": "quantkit.backends.external:ExternalBackend",
        "fp8": "quantkit.backends.fp8:FP8Backend",
        "gguf": "quantkit.backends.gguf:GGUFBackend",
        "gptq": "quantkit.backends.gptq:GPTQBackend",
        "rtn": "quantkit.backends.rtn:RTNBackend",
    },
    RecipeError,
    group="quantkit.backends",
)


def backend_names() -> list[str]:
    """Registered backend names, sorted."""
    return BACKENDS.names()


def get_backend(name: str) -> type[Backend[BackendOptions]]:
    """The backend class registered under ``name``."""
    return BACKENDS.get(name)

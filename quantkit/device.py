"""Device selection: ``auto`` picks CUDA when present."""

from __future__ import annotations

from quantkit.errors import UserInputError


def resolve_device(requested: str) -> str:
    """Map ``auto|cpu|cuda`` to a concrete device, refusing CUDA when there is none."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserInputError("--device cuda asked for, but no CUDA device is visible", "use --device cpu")
    if requested not in ("cpu", "cuda"):
        raise UserInputError(f"unknown device '{requested}'", "use auto, cpu or cuda")
    return requested

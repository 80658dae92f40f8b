"""Device selection (``auto`` picks CUDA when present) and the baseline precision per device.

The baseline is computed in float32 on the CPU (exact, and fast there) and in bfloat16 on
CUDA unless the recipe's ``baseline.dtype`` names another; this module is the one place that
rule lives.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Literal, cast

from quantkit.errors import UserInputError

if TYPE_CHECKING:
    import torch

BaselineDtype = Literal["float32", "bfloat16", "float16"]
_BITS: dict[BaselineDtype, int] = {"float32": 32, "bfloat16": 16, "float16": 16}


class DeviceChoice(str, Enum):
    """What ``--device`` accepts."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def cpu_threads() -> int:
    """The CPU threads a run uses where none is set: ``OMP_NUM_THREADS`` when it is a positive
    integer (torch honours it too, so llama.cpp and torch agree on a machine shared with other
    jobs), else every core."""
    import os

    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else os.cpu_count() or 1


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


def baseline_dtype(device: str, requested: str = "auto") -> BaselineDtype:
    """The precision the unquantized baseline is loaded and scored in on ``device``:
    ``requested`` (the recipe's ``baseline.dtype``), or for ``auto`` float32 on the CPU and
    bfloat16 on CUDA."""
    if requested == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    if requested not in _BITS:
        raise UserInputError(
            f"unknown baseline dtype '{requested}'", "use auto, float32, bfloat16 or float16"
        )
    return cast("BaselineDtype", requested)


def dtype_bits(dtype: BaselineDtype) -> int:
    return _BITS[dtype]


def torch_dtype(dtype: BaselineDtype) -> torch.dtype:
    import torch

    dtypes: dict[BaselineDtype, torch.dtype] = {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }
    return dtypes[dtype]


def compute_dtype(device: str) -> torch.dtype:
    """The torch dtype models are loaded in for quantization on ``device`` (the ``auto``
    baseline precision; the recipe's ``baseline.dtype`` governs measurement only)."""
    return torch_dtype(baseline_dtype(device))

"""Device selection (``auto`` picks CUDA when present) and the baseline precision per device.

The baseline is computed in float32 on the CPU (exact, and fast there) and in bfloat16 on
CUDA; this module is the one place that rule lives.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Literal

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


def baseline_dtype(device: str) -> BaselineDtype:
    """The precision the unquantized baseline is loaded and scored in on ``device``."""
    return "float32" if device == "cpu" else "bfloat16"


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
    """The torch dtype models are loaded in on ``device`` (the baseline's)."""
    return torch_dtype(baseline_dtype(device))

"""Pre-flight estimate: weights and KV-cache memory per format, and whether they fit a device.

Computed from config.json and the safetensors headers only (no weights are loaded).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import UserInputError

GIB = 1024**3
# Usable memory of named devices (bytes); "auto" means this machine's.
DEVICE_MEMORY = {
    "l4": 24 * GIB,
    "a10g": 24 * GIB,
    "rtx4090": 24 * GIB,
    "l40s": 48 * GIB,
    "a100-40gb": 40 * GIB,
    "a100-80gb": 80 * GIB,
    "h100-80gb": 80 * GIB,
    "h200": 141 * GIB,
}
_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}


@dataclass
class Plan:
    """Memory needs of one recipe on one model."""

    parameters: int
    linear_parameters: int
    baseline_weights_bytes: int
    quantized_weights_bytes: int
    kv_cache_bytes: int
    context: int
    batch: int
    scheme: str
    weight_bits: float
    device: str
    device_memory_bytes: int | None

    @property
    def serving_bytes(self) -> int:
        return self.quantized_weights_bytes + self.kv_cache_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory_bytes is None else self.serving_bytes <= self.device_memory_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"serving_bytes": self.serving_bytes, "fits": self.fits}


def _tensor_shapes(folder: Path) -> dict[str, tuple[list[int], str]]:
    """name -> (shape, dtype) from the safetensors headers; corrupt or truncated files are refused."""
    shapes: dict[str, tuple[list[int], str]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        corrupt = UserInputError(
            f"'{path}' is not a valid safetensors file (corrupt or truncated)",
            "re-download or re-save the model",
        )
        file_size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise corrupt
            (size,) = struct.unpack("<Q", prefix)
            if size > min(100_000_000, file_size - 8):
                raise corrupt
            try:
                header = json.loads(handle.read(size))
                tensors = {k: v for k, v in header.items() if k != "__metadata__"}
                data_end = max((int(v["data_offsets"][1]) for v in tensors.values()), default=0)
                entries = [(k, list(v["shape"]), str(v["dtype"])) for k, v in tensors.items()]
            except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
                raise corrupt from None
        if 8 + size + data_end > file_size:
            raise corrupt
        for name, shape, dtype in entries:
            shapes[name] = (shape, dtype)
    return shapes


def _count(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


@dataclass(frozen=True)
class Target:
    """What the weights become: the scheme, its bits per weight, whether embeddings shrink too."""

    scheme: str
    weight_bits: float
    quantizes_embeddings: bool = False


@dataclass(frozen=True)
class Serving:
    """How the model is served: tokens of KV cache per sequence, sequences, on which device."""

    context: int
    batch: int
    device: str
    device_memory: int | None = None


def estimate(model_path: Path, target: Target, serving: Serving) -> Plan:
    """Estimate weights (before/after) and KV cache for ``context`` x ``batch`` tokens."""
    weight_bits, scheme = target.weight_bits, target.scheme
    context, batch = serving.context, serving.batch
    config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    shapes = _tensor_shapes(model_path)
    if not shapes:
        raise UserInputError(
            f"'{model_path}' has no safetensors weights to plan from", "convert it to safetensors"
        )
    params = linear = baseline_bytes = 0
    embeddings = 0
    for name, (shape, dtype) in shapes.items():
        count = _count(shape)
        params += count
        baseline_bytes += count * _DTYPE_BYTES.get(dtype, 2)
        if len(shape) == 2 and ".layers." in name:
            linear += count
        elif len(shape) == 2:
            embeddings += count
    rest = params - linear - embeddings
    embed_bits = weight_bits if target.quantizes_embeddings else 16.0
    quantized = int(linear * weight_bits / 8 + embeddings * embed_bits / 8 + rest * 2)
    layers = int(config.get("num_hidden_layers", 0))
    heads = int(config.get("num_attention_heads", 1))
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or config.get("hidden_size", 0) // max(heads, 1))
    per_token = 2 * kv_heads * head_dim * batch * 2  # K and V of one layer, fp16
    kv = sum(per_token * tokens for tokens in kv_tokens_per_layer(config, layers, context))
    return Plan(
        params,
        linear,
        baseline_bytes,
        quantized,
        kv,
        context,
        batch,
        scheme,
        weight_bits,
        serving.device,
        serving.device_memory,
    )


_WINDOWED = ("sliding_attention", "chunked_attention")


def kv_tokens_per_layer(config: dict[str, Any], layers: int, context: int) -> list[int]:
    """Tokens each layer keeps in its KV cache: ``context``, or the window for sliding-window
    layers (config ``layer_types``, as Gemma 2/3 and Qwen write them; without it a set
    ``sliding_window`` applies to every layer, as Mistral's does, unless ``use_sliding_window``
    is false)."""
    window = config.get("sliding_window") or config.get("attention_chunk_size")
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return [min(context, int(window)) if window and kind in _WINDOWED else context for kind in types]
    if window and config.get("use_sliding_window") is not False:
        return [min(context, int(window))] * layers
    return [context] * layers


def machine_memory(device: str) -> int:
    """Memory available for a model on this machine's ``device`` (free GPU memory or RAM)."""
    if device == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def check_quantization_fits(baseline_weights_bytes: int, device: str) -> None:
    """Refuse a run whose baseline cannot even be loaded twice (model + working copy)."""
    need = 2 * baseline_weights_bytes
    have = machine_memory(device)
    if need > have:
        raise UserInputError(
            f"not enough memory on {device}: quantizing needs about {need / GIB:.1f} GiB "
            f"(2 x {baseline_weights_bytes / GIB:.1f} GiB of weights), {have / GIB:.1f} GiB available",
            "free memory, use a larger device, or run `quantkit plan` to see the numbers",
        )


def tensor_bytes(folder: Path) -> int:
    """Bytes of tensor data in a folder's safetensors files (headers excluded)."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            prefix = handle.read(8)
        if len(prefix) == 8:
            total += path.stat().st_size - 8 - struct.unpack("<Q", prefix)[0]
    return total


def stored_dtypes(model_path: Path) -> dict[str, int]:
    """Elements stored per safetensors dtype name (``BF16``, ``F32``, ...) in an HF folder."""
    counts: dict[str, int] = {}
    for shape, dtype in _tensor_shapes(model_path).values():
        counts[dtype] = counts.get(dtype, 0) + _count(shape)
    return counts


def count_parameters(model_path: Path) -> int:
    """Parameters of an HF folder, from its safetensors headers (0 when there are none)."""
    return sum(_count(shape) for shape, _ in _tensor_shapes(model_path).values())

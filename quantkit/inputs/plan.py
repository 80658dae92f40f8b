"""Pre-flight estimate: weights and KV-cache memory per format, and whether they fit a device.

Computed from config.json and the safetensors headers only (no weights are loaded).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantkit.errors import UserInputError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from quantkit.llamacpp.gguf_types import GGUFTensor, ModelShape, Overrides

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


def tensor_shapes(folder: Path) -> dict[str, tuple[list[int], str]]:
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
    """What the weights become: the scheme and its bits per quantized weight; for GGUF the
    llama-quantize file type (each tensor then gets llama.cpp's own type for it)."""

    scheme: str
    weight_bits: float
    gguf_type: str | None = None
    imatrix: bool = False
    gguf_overrides: Overrides | None = None  # per-tensor types (llama-quantize's --tensor-type)
    module_bits: Mapping[str, float] | None = None  # per-layer integer schemes: module -> bits


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
    shapes = tensor_shapes(model_path)
    if not shapes:
        raise UserInputError(
            f"'{model_path}' has no safetensors weights to plan from", "convert it to safetensors"
        )
    params = linear = baseline_bytes = kept_bytes = 0
    quantized_linear_bits = 0.0
    for name, (shape, dtype) in shapes.items():
        count = _count(shape)
        params += count
        baseline_bytes += count * _DTYPE_BYTES.get(dtype, 2)
        if len(shape) == 2 and ".layers." in name:
            linear += count
            module = name.removesuffix(".weight")
            if target.module_bits is not None and module in target.module_bits:
                quantized_linear_bits += count * target.module_bits[module]
            else:
                quantized_linear_bits += count * weight_bits
        else:  # embeddings, the head, norms: kept in the source's dtype by every HF format
            kept_bytes += count * _DTYPE_BYTES.get(dtype, 2)
    layers = int(config.get("num_hidden_layers", 0))
    heads = int(config.get("num_attention_heads", 1))
    if target.gguf_type is not None:
        quantized = gguf_bytes(model_path, target.gguf_type, target.imatrix, target.gguf_overrides)
    else:
        quantized = int(quantized_linear_bits / 8 + kept_bytes)
    if target.module_bits is not None and linear:
        weight_bits = round(quantized_linear_bits / linear, 4)  # the layers' mean, overrides included
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


def gguf_tensors(model_path: Path) -> tuple[list[GGUFTensor], ModelShape]:
    """The tensors of the GGUF llama.cpp's converter makes from an HF folder (its names, ``ne``
    and order), and the hyperparameters the quantization rules read."""
    from quantkit.llamacpp.gguf_types import GGUFTensor, ModelShape, gguf_name

    config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    names = {name: shape for name, (shape, _) in tensor_shapes(model_path).items()}
    if config.get("tie_word_embeddings", True) and any(n.endswith("embed_tokens.weight") for n in names):
        names.pop("lm_head.weight", None)  # the converter writes a tied head once
    tensors = sorted(
        (GGUFTensor(gguf_name(name), tuple(reversed(shape))) for name, shape in names.items()),
        key=file_order,
    )
    heads = int(config.get("num_attention_heads", 1))
    shape = ModelShape(
        n_layer=int(config.get("num_hidden_layers", 0)),
        n_gqa=heads // max(int(config.get("num_key_value_heads", heads)), 1),
    )
    return tensors, shape


def gguf_tensor_types(
    model_path: Path, file_type: str, imatrix: bool = False, overrides: Overrides | None = None
) -> list[tuple[GGUFTensor, str]]:
    """Each tensor of the GGUF llama-quantize makes from an HF folder, with the ggml type
    llama.cpp picks for it (``quantkit.llamacpp.gguf_types``)."""
    from quantkit.llamacpp.gguf_types import tensor_types

    tensors, shape = gguf_tensors(model_path)
    types = tensor_types(tensors, file_type, shape, imatrix, overrides)
    return [(tensor, types[tensor.name]) for tensor in tensors]


def file_order(tensor: GGUFTensor) -> tuple[int, str]:
    """llama-quantize's order, which the per-layer rules count in: layer by layer (safetensors
    headers and the converter list ``layers.10`` before ``layers.2``), the rest first."""
    found = re.match(r"blk\.(\d+)\.", tensor.name)
    return (int(found.group(1)) if found else -1, tensor.name)


def gguf_bytes(
    model_path: Path, file_type: str, imatrix: bool = False, overrides: Overrides | None = None
) -> int:
    """Size of that GGUF: its tensors in their types plus the vocabulary it carries."""
    from quantkit.llamacpp.gguf_types import tensor_bytes

    tensors = gguf_tensor_types(model_path, file_type, imatrix, overrides)
    return sum(tensor_bytes(tensor, kind) for tensor, kind in tensors) + vocabulary_bytes(model_path)


def vocabulary_bytes(model_path: Path) -> int:
    """What a GGUF stores of the tokenizer: each token (u64 length + bytes) and its type (i32),
    plus a score per token (SentencePiece vocabularies) or the merges (BPE)."""
    path = model_path / "tokenizer.json"
    if not path.is_file():
        return 0
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    tokens: dict[int, str] = (
        {int(i): t for t, i in (model.get("vocab") or {}).items()}
        if isinstance(model.get("vocab"), dict)
        else {}
    )
    for added in data.get("added_tokens") or []:
        tokens[int(added["id"])] = str(added["content"])
    count = max(tokens, default=-1) + 1
    total = sum(8 + len(text.encode("utf-8")) for text in tokens.values()) + 8 * (count - len(tokens))
    total += 4 * count  # token types
    if (model_path / "tokenizer.model").is_file():
        total += 4 * count  # scores
    else:
        merges = model.get("merges") or []
        total += sum(8 + len((m if isinstance(m, str) else " ".join(m)).encode("utf-8")) for m in merges)
    return total


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
    for shape, dtype in tensor_shapes(model_path).values():
        counts[dtype] = counts.get(dtype, 0) + _count(shape)
    return counts


def count_parameters(model_path: Path) -> int:
    """Parameters of an HF folder, from its safetensors headers (0 when there are none)."""
    return sum(_count(shape) for shape, _ in tensor_shapes(model_path).values())

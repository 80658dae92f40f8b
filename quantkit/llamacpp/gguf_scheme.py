"""What a GGUF's quantization is called, from what the file holds.

A GGUF header names one file type (``general.file_type``: Q8_0, Q4_K_M...), also when its
tensors were given other types (llama-quantize's ``--tensor-type``, a searched mix). The
label is that name only when the quantized tensors are what llama-quantize's preset for the
type writes (``quantkit.llamacpp.gguf_types``, with or without an importance matrix); otherwise
"mixed", with the share of the quantized weights each type holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from quantkit.llamacpp.gguf_file import GGUFFile, read_gguf
from quantkit.llamacpp.gguf_types import DEFAULT_TYPE, GGUFTensor, ModelShape, quantized, tensor_types

_SPECIAL = ("token_embd.weight", "output.weight")  # presets and flags type these on their own
_SHOWN_TYPES = 2  # types named in a mixed label; the rest are counted


@dataclass(frozen=True)
class GGUFScheme:
    """A GGUF's quantization: its label, its header's file type, and each type's share (%)."""

    label: str
    file_type: str | None
    mixed: bool
    shares: dict[str, float]


def gguf_scheme(path: Path) -> GGUFScheme:
    """The file type's name when the file holds its preset's types, else "mixed ..."."""
    header = read_gguf(path)
    file_type = _file_type(header)
    tensors = [GGUFTensor(t.name, tuple(t.shape)) for t in header.tensors]
    written = {t.name: t.type_name for t in header.tensors}
    weights = [tensor for tensor in tensors if quantized(tensor)]
    elements: Counter[str] = Counter()
    for tensor in weights:
        elements[written[tensor.name]] += tensor.elements
    total = sum(elements.values()) or 1
    shares = {name: round(100 * count / total, 1) for name, count in elements.most_common()}
    if file_type is not None and _is_preset(header, file_type, tensors, weights, written):
        return GGUFScheme(file_type, file_type, False, shares)
    if file_type is None and len(shares) <= 1:
        return GGUFScheme(next(iter(shares), "unknown"), None, False, shares)
    shown = " ".join(f"{name} {share:.0f}%" for name, share in list(shares.items())[:_SHOWN_TYPES])
    more = len(shares) - _SHOWN_TYPES
    return GGUFScheme(f"mixed {shown}" + (f" +{more}" if more > 0 else ""), file_type, True, shares)


def _file_type(header: GGUFFile) -> str | None:
    import gguf  # numpy: not on the CLI's start-up path

    value = header.value("general.file_type")
    if not isinstance(value, int):
        return None
    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return None


def _is_preset(
    header: GGUFFile,
    file_type: str,
    tensors: list[GGUFTensor],
    weights: list[GGUFTensor],
    written: dict[str, str],
) -> bool:
    """Whether the quantized tensors have the types llama-quantize's ``file_type`` preset gives
    them. Where quantkit cannot predict the preset (a type its port lacks, experts), the block
    tensors must all hold the file type's own type."""
    shape = _shape(header)
    if file_type in DEFAULT_TYPE and shape is not None and not any("_exps." in t.name for t in tensors):
        for imatrix in (False, True):
            expected = tensor_types(tensors, file_type, shape, imatrix)
            if all(expected[t.name] == written[t.name] for t in weights):
                return True
        return False
    own = DEFAULT_TYPE.get(file_type, file_type)
    return all(written[t.name] == own for t in weights if t.name not in _SPECIAL)


def _shape(header: GGUFFile) -> ModelShape | None:
    """Layers and heads per KV head from the header (None: not plain integers)."""
    arch = header.value("general.architecture")
    layers = header.value(f"{arch}.block_count")
    heads = header.value(f"{arch}.attention.head_count")
    kv_heads = header.value(f"{arch}.attention.head_count_kv")
    if not isinstance(layers, int) or not isinstance(heads, int):
        return None
    kv = kv_heads if isinstance(kv_heads, int) and kv_heads > 0 else heads
    return ModelShape(n_layer=layers, n_gqa=heads // kv)

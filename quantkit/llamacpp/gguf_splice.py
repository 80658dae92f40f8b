"""A GGUF made of two GGUFs of the same model: every tensor from ``base`` except the named ones,
which come from ``other`` (same names and shapes, another type).

llama.cpp quantizes each tensor on its own (without an importance matrix, from the same
unquantized file), so a tensor's bytes in a file quantized all-Q4_0 are the bytes llama-quantize
writes for it under a ``--tensor-type ...=Q4_0`` override. Splicing two quantized files gives
the file of any such mix for the cost of a copy: the sensitivity profile uses it to measure one
part at a time without quantizing the model once per part. The metadata (key/values) is
``base``'s, byte for byte.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Collection
from pathlib import Path

from quantkit.errors import BackendError
from quantkit.llamacpp.gguf_file import MAGIC, TensorInfo, _Parser, read_gguf

_DEFAULT_ALIGNMENT = 32


def _metadata_bytes(path: Path) -> tuple[int, int, bytes]:
    """The version, the key/value count and the raw key/value bytes of a GGUF."""
    import mmap

    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        view = memoryview(data)
        parser = _Parser(view, path)
        try:
            parser.pos = 4
            version = parser._scalar("I")
            parser._scalar("Q")
            n_fields = parser._scalar("Q")
            start = parser.pos
            for _ in range(n_fields):
                parser._string()
                parser._value(parser._scalar("I"))
            raw = bytes(view[start : parser.pos])
        finally:
            view.release()
    return version, n_fields, raw


def splice(base: Path, other: Path, names: Collection[str], target: Path) -> None:
    """Write ``target``: ``base`` with the tensors in ``names`` taken from ``other``."""
    head, donor = read_gguf(base), read_gguf(other)
    donors = {t.name: t for t in donor.tensors}
    missing = [name for name in names if name not in donors]
    if missing:
        raise BackendError(f"'{other}' has no tensor {missing[0]}", "splice files of the same model")
    alignment = int(head.value("general.alignment") or _DEFAULT_ALIGNMENT)
    version, n_fields, metadata = _metadata_bytes(base)
    chosen: list[tuple[TensorInfo, Path]] = [
        (donors[t.name], other) if t.name in names else (t, base) for t in head.tensors
    ]
    infos, offset = bytearray(), 0
    for tensor, _ in chosen:
        encoded = tensor.name.encode()
        infos += struct.pack("<Q", len(encoded)) + encoded + struct.pack("<I", len(tensor.shape))
        infos += struct.pack(f"<{len(tensor.shape)}Q", *tensor.shape)
        infos += struct.pack("<IQ", tensor.type_id, offset)
        offset += -(-tensor.n_bytes // alignment) * alignment
    header = MAGIC + struct.pack("<IQQ", version, len(chosen), n_fields) + metadata + bytes(infos)
    header += b"\0" * (-len(header) % alignment)
    partial = target.with_name(f".{target.name}.partial")
    try:
        with partial.open("wb") as out, base.open("rb") as from_base, other.open("rb") as from_other:
            out.write(header)
            for tensor, source in chosen:
                handle = from_other if source == other else from_base
                handle.seek(tensor.data_offset)
                out.write(handle.read(tensor.n_bytes))
                out.write(b"\0" * (-tensor.n_bytes % alignment))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)

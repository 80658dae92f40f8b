"""A GGUF file's header: metadata and tensor infos, read once per file and process.

``gguf.GGUFReader`` builds a numpy view for every part of every field: on a 49k-token
vocabulary that takes 2-4 s per call, and a run used to make six. This reads the same header
(the GGUF spec: magic, version, counts, key/values, tensor infos, aligned data) in one pass
with ``struct`` and keeps it per (path, size, mtime): numeric arrays come out as lists, string
arrays as lists of ``str``. Tensor data is never read here; llama.cpp does that.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# GGUFValueType -> struct format of one scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The bytes are not a whole GGUF header (wrong magic, truncated, unknown value type)."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it; ``shape`` in GGUF order (``ne[0]`` first)."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    data_offset: int  # absolute, in the file
    n_elements: int
    n_bytes: int

    @property
    def type_name(self) -> str:
        import gguf

        try:
            return gguf.GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type {self.type_id}"


@dataclass(frozen=True)
class GGUFFile:
    """Metadata (``fields``: key -> Python value) and tensor infos of one GGUF file."""

    path: Path
    version: int
    fields: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int

    def value(self, key: str) -> Any:
        return self.fields.get(key)

    @property
    def data_end(self) -> int:
        """Where the last tensor's data ends (past the file's size: a truncated file)."""
        return max((t.data_offset + t.n_bytes for t in self.tensors), default=self.data_offset)


def read_gguf(path: Path) -> GGUFFile:
    """The header of the GGUF at ``path``, parsed once per (path, size, mtime) in a process."""
    stat = path.stat()
    return _read_cached(path.resolve(), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _read_cached(path: Path, _size: int, _mtime_ns: int) -> GGUFFile:
    with path.open("rb") as handle:
        if _size < 24:
            raise GGUFFormatError(f"{_size} bytes: shorter than a GGUF header")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _Parser(memoryview(data), path).file()


class _Parser:
    def __init__(self, data: memoryview, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def file(self) -> GGUFFile:
        try:
            return self._file()
        except (struct.error, UnicodeDecodeError, IndexError) as err:
            raise GGUFFormatError(f"header unreadable at byte {self.pos}: {err}") from None
        finally:
            self.data.release()

    def _file(self) -> GGUFFile:
        if bytes(self.data[:4]) != MAGIC:
            raise GGUFFormatError("no GGUF magic")
        self.pos = 4
        version = self._scalar("I")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} (2 and 3 are known)")
        n_tensors, n_fields = self._scalar("Q"), self._scalar("Q")
        fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._string()
            fields[key] = self._value(self._scalar("I"))
        raw = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(fields.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = -(-self.pos // alignment) * alignment
        tensors = tuple(_tensor(name, shape, kind, start + offset) for name, shape, kind, offset in raw)
        return GGUFFile(self.path, version, fields, tensors, start)

    def _scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._scalar("Q")
        end = self.pos + length
        if end > len(self.data):
            raise GGUFFormatError(f"a string of {length} bytes runs past the end of the file")
        text = bytes(self.data[self.pos : end]).decode("utf-8")
        self.pos = end
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._scalar("I"), self._scalar("Q")
            if item == _STRING:
                return [self._string() for _ in range(count)]
            if item == _ARRAY:
                return [self._value(self._scalar("I")) for _ in range(count)]
            fmt = _SCALARS.get(item)
            if fmt is None:
                raise GGUFFormatError(f"unknown array item type {item}")
            size = struct.calcsize(fmt) * count
            if self.pos + size > len(self.data):
                raise GGUFFormatError(f"an array of {count} items runs past the end of the file")
            values = list(struct.unpack_from(f"<{count}{fmt}", self.data, self.pos))
            self.pos += size
            return values
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise GGUFFormatError(f"unknown value type {kind}")
        return self._scalar(fmt)

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        dims = self._scalar("I")
        shape = tuple(self._scalar("Q") for _ in range(dims))
        return name, shape, self._scalar("I"), self._scalar("Q")


def _tensor(name: str, shape: tuple[int, ...], type_id: int, offset: int) -> TensorInfo:
    import gguf

    n_elements = 1
    for dim in shape:
        n_elements *= dim
    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"tensor '{name}' has unknown type {type_id}") from None
    return TensorInfo(name, shape, type_id, offset, n_elements, n_elements // block * type_size)
